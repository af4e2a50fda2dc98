# LLM parallelisms in C, spelled out.
#
#   make              build every program, and tools/schedules and tools/costmodel (installs OpenMPI
#                     first if it is missing and you are root; MPICH when MPICC names it)
#   make run          the main job: train.c and every strategy, compared (QUICK=1: fewer steps)
#   make test         every test; the last line says "N passed, N failed" (QUICK=1: a few minutes, every program once)
#   make check        every program built with AddressSanitizer and UBSan, and a fast subset of the tests
#   make fuzz         every reader of outside input (data, checkpoints, flags, the tools' files) under libFuzzer (clang)
#   make zoo          the bug zoo: 27 classic bugs of distributed training, each caught by a test
#   make cluster      make run's comparison across emulated hosts (root), with a cost model's predictions
#                     (HOSTS=2 or 4, LINK="1gbit 100mbit", QUICK=1)
#   make bench        the performance tables of docs/performance.md (installs OpenBLAS and PyTorch for them if missing)
#   make OMP=1 ...    split the kernels across OpenMP threads (the results do not change)
#   make clean
#
# MPI programs run with `mpirun -n N ./train_X`. Every target here runs them through
# tools/mpirun, which adds what OpenMPI needs (--oversubscribe for more ranks than cores, and
# permission to run as root) and nothing for MPICH. Another MPI than the default `mpicc` and
# `mpirun`: make MPICC=mpicc.mpich MPIEXEC=mpirun.mpich test (after make clean; as root it
# installs mpich and libmpich-dev if they are missing).
#
# No flag here changes a result: the sources control contraction and refuse fast-math
# themselves (util.h), so `mpicc train_dp.c -o train_dp -lm` gives the same names as this.

CC = cc
MPICC = mpicc
MPIEXEC = mpirun
export MPIEXEC
OPT = -O3 -march=native
# -fno-math-errno: GCC then vectorizes loops that call sqrtf (AdamW's), which util.h's pragma
# does not achieve; sqrtf is correctly rounded, so no result changes
CFLAGS = $(OPT) -fno-math-errno -std=c11 -Wall -Wextra
LDLIBS = -lm
ifeq ($(OMP),1)
CFLAGS += -fopenmp
endif

HEADERS = util.h kernels.h layers.h transformer.h config.h moe.h model.h optim.h data.h ckpt.h cli.h report.h
PROGRAMS = train train_dp train_fsdp train_tp train_pp train_3d train_ep train_cp
TESTS = tests/test_units tools/compare tools/report tools/schedules tools/costmodel tools/pingpong

.PHONY: all run test check fuzz zoo cluster bench pages diverge clean mpi openblas
# the two tools the pages run beside the programs (plain C, no MPI)
all: $(PROGRAMS) tools/schedules tools/costmodel

train: train.c $(HEADERS)
	$(CC) $(CFLAGS) -o $@ train.c $(LDLIBS)

# MPI programs: check for MPI first (tools/need.sh installs it as root: MPICH's packages when
# MPICC or MPIEXEC names mpich, OpenMPI's otherwise)
MPI_PACKAGES = $(if $(findstring mpich,$(MPICC) $(MPIEXEC)),mpich libmpich-dev,openmpi-bin libopenmpi-dev)
mpi:
	@tools/need.sh $(MPICC) $(MPI_PACKAGES)
	@tools/need.sh $(MPIEXEC) $(firstword $(MPI_PACKAGES))
train_%: train_%.c $(HEADERS) dist.h schedules.h | mpi
	$(MPICC) $(CFLAGS) -o $@ $< $(LDLIBS)
train_3d: train_3d.c train_fsdp.c train_tp.c train_pp.c train_cp.c train_ep.c $(HEADERS) dist.h schedules.h | mpi
	$(MPICC) $(CFLAGS) -o $@ train_3d.c $(LDLIBS)

tests/test_units: tests/test_units.c $(HEADERS)
	$(CC) $(CFLAGS) -o $@ tests/test_units.c $(LDLIBS)
tools/compare: tools/compare.c $(HEADERS)
	$(CC) $(CFLAGS) -o $@ tools/compare.c $(LDLIBS)
tools/report: tools/report.c tools/summary.h util.h
	$(CC) $(CFLAGS) -o $@ tools/report.c $(LDLIBS)
tools/schedules: tools/schedules.c schedules.h $(HEADERS)
	$(CC) $(CFLAGS) -o $@ tools/schedules.c $(LDLIBS)
tools/costmodel: tools/costmodel.c tools/costmodel_cluster.h tools/costmodel_llm.h tools/summary.h $(HEADERS) schedules.h
	$(CC) $(CFLAGS) -o $@ tools/costmodel.c $(LDLIBS)
tools/pingpong: tools/pingpong.c util.h dist.h | mpi
	$(MPICC) $(CFLAGS) -o $@ tools/pingpong.c $(LDLIBS)

# The benchmark, and only the benchmark, links OpenBLAS. The check is for the library itself:
# cblas.h alone proves nothing, since libblas-dev (the reference BLAS) installs it too. The
# compiler says where it would find -lopenblas (its bare name if nowhere); if nowhere, the
# path Debian's libopenblas-dev installs it at is what tools/need.sh installs and checks.
OPENBLAS_LIB = $(shell $(CC) -print-file-name=libopenblas.so)
openblas:
	@tools/need.sh $(if $(filter /%,$(OPENBLAS_LIB)),$(OPENBLAS_LIB),/usr/lib/$(shell $(CC) -print-multiarch)/libopenblas.so) libopenblas-dev
bench/bench: bench/bench.c $(HEADERS) | openblas
	$(CC) $(CFLAGS) -o $@ bench/bench.c -lopenblas $(LDLIBS)
bench/train_omp: train.c $(HEADERS)
	$(CC) $(CFLAGS) -fopenmp -o $@ train.c $(LDLIBS)
# train.c as a user builds it by hand, with no flag at all (the README's hand build; the 'built plain' row)
bench/train_plain: train.c $(HEADERS)
	$(CC) -o $@ train.c $(LDLIBS)
# and PyTorch (Debian's python3-torch) is its third yardstick: without it, those rows are left out
# and the pictures (bench/plot.py: python3, no library) go to out/bench/ and docs/
bench: all bench/bench bench/train_omp bench/train_plain
	-@tools/need.sh /usr/lib/python3/dist-packages/torch/__init__.py python3-torch
	@tools/need.sh python3 python3
	@bash bench/run.sh

# the main job: every program side by side (QUICK=1: fewer steps)
run: all tools/compare tools/report tools/schedules
	@QUICK=$(QUICK) bash tools/run_all.sh

# how far layouts drift when gradient pieces add as floats: out/diverge.svg, out/diverge.md
# (tools/diverge.py; QUICK=1: 2,000 steps)
diverge: train train_dp
	@tools/need.sh python3 python3
	@QUICK=$(QUICK) python3 tools/diverge.py

test: all $(TESTS)
	@tools/need.sh xmllint libxml2-utils
	@bash tests/run.sh $(if $(QUICK),units cli quick)

# sanitizers: a copy of the tree built with ASan and UBSan, a subset of the tests on it
check:
	@bash tools/check.sh

# libFuzzer on the readers of outside input, a million inputs each (tests/fuzz.c)
fuzz: train
	@bash tools/fuzz.sh

# make run across emulated hosts (network namespaces; root): tools/cluster.sh, tools/costmodel.c
cluster: all tools/compare tools/report tools/costmodel tools/pingpong
	@HOSTS=$(HOSTS) LINK="$(LINK)" QUICK=$(QUICK) bash tools/cluster_run.sh

# the bug zoo (tests/zoo/*.patch): each bug applied to a copy, the suite run until it fails
# every command of the pages (tests/pages.sh, also in make test), and each tools/tables.sh
# section's tables against its page
pages: all $(TESTS)
	@bash tests/pages.sh --tables

zoo:
	@tools/need.sh patch patch
	@tools/need.sh bc bc
	@bash tools/zoo.sh

clean:
	rm -f $(PROGRAMS) $(TESTS) bench/bench bench/train_omp bench/train_plain
