/*
 * tools/costmodel_llm.h: one training step of a transformer on a described cluster, in
 * closed form: its parameters and FLOPs, the memory each device holds, and the time of each
 * part of the step, for one layout of tensor (TP), context (CP), pipeline (PP), data (DP)
 * and expert (EP) parallelism. tools/costmodel.c ranks layouts with it (predict, rank,
 * published); every formula has a case computed by hand in its selftest.
 *
 * The model, per device (devices work in parallel; ranks are ordered TP fastest, then CP,
 * then DP with EP's groups inside it, then PP, as train_3d.c orders its grid):
 *
 *   step = (compute + TP + CP + EP exposed) / (1 - bubble) + PP sends + DP exposed + optimizer
 *
 *   compute   a microbatch's matrix products at their shapes (M, N, K: tile and wave
 *             quantization over the SMs, the roofline of skinny products; FP8 layers at
 *             the FP8 rate with --fp8), attention's core at its kernel's rate for the
 *             sequence (or unfused), every tensor-core rate at the clock a device sustains
 *             at its power limit; and the memory-bound work (norms, residuals, RoPE,
 *             SwiGLU, the MoE's copies, dropout, FP8's quantization) at HBM's rate. The
 *             first device also does the embedding, the last the head, the loss and any
 *             MTP modules; layers are split so the slowest device is as fast as can be,
 *             and the pipeline runs at its pace. Hidden traffic takes --comm-sms of the SMs
 *             while it runs.
 *   TP        Megatron's two all-reduces per layer forward and two backward (with sequence
 *             parallelism: an all-gather and a reduce-scatter for each, the same time), a
 *             stated fraction hidden behind the products (--tp-overlap)
 *   CP        each layer gathers the K and V of the whole sequence forward, again backward,
 *             and reduce-scatters their gradients; as a ring it hides behind attention
 *   EP        four all-to-alls per MoE layer (dispatch and combine, forward and backward;
 *             with node-limited routing a token crosses once to each node it reaches), a
 *             stated fraction hidden behind compute (--ep-overlap); under DualPipe and
 *             dualpipev a chunk's all-to-alls and pipeline sends hide behind the compute of
 *             the chunk it is paired with (an F&B takes the longer of the two, not the sum)
 *   bubble    the schedule's idle fraction (schedules.h's closed forms; zbv played there;
 *             DualPipe's from DeepSeek-V3's report)
 *   PP        a microbatch's activations across each stage boundary, forward and back
 *   DP        the gradients reduce-scattered and the parameters all-gathered (an all-
 *             reduce's time; ZeRO-3 gathers once more for backward), a stated fraction
 *             hidden behind a microbatch's compute (--dp-overlap)
 *   optimizer Adam's step over the device's ZeRO shard, memory-bound
 *
 * A collective over n devices whose block of ranks divides a node uses the node's links,
 * else the links between nodes, whose NICs the node's crossing rings share (the slowest link
 * of a ring sets its pace): ring all-reduce 2(n-1) steps of 1/n of the buffer, all-gather
 * and reduce-scatter n-1 steps, each alpha + bytes / beta, after NCCL's base latency.
 * "Hidden" traffic hides only behind compute that exists: at most the compute's time, and
 * all the traffic hidden behind a stretch of compute (TP's, CP's, EP's, an F&B's sends) at
 * most that stretch, whatever runs beside it; DP behind what a microbatch's compute leaves.
 *
 * Not modelled (each a reason real runs are slower than predicted): stragglers and jitter
 * across thousands of devices, congestion, kernel launches.
 *
 * Memory: 2-byte weights and gradients and 12 bytes of FP32 master weights, m and v per
 * parameter, sharded by ZeRO's stage over the devices that hold the same weights; the
 * activations of Korthikanti et al. (2022), "Reducing Activation Recomputation in Large
 * Transformer Models", term by term, times the microbatches the schedule holds at its peak.
 */
#ifndef COSTMODEL_LLM_H
#define COSTMODEL_LLM_H

#include "../schedules.h"
#include "costmodel_cluster.h"

// ----------------------------------------------------------------------------
// the model

typedef struct {
    int layers, width, heads, kv_heads, head_dim, ffn; // head_dim: of Q, K and V (width / heads unless given)
    int vocab, seq;
    int swiglu;                                        // SwiGLU MLP (3 matrices), else GELU (2)
    int experts, top_k, expert_ffn, shared, dense;     // MoE: routed experts (0: none), per token, width, shared experts, first dense layers
    int q_lora, kv_lora, rope;                         // MLA (kv_lora > 0): latent ranks and the decoupled RoPE width
    int dropout;                                       // dropout masks kept for backward (Korthikanti's GPT)
    int mtp;                                           // multi-token prediction modules (DeepSeek-V3's D), beside the head
    double tokens;                                     // per step
} Shape;

// What a run does that is not its layout.
typedef struct {
    int fp8;                       // the blocks' matrix products in FP8 (the head and attention in BF16)
    double dp_overlap, ep_overlap; // fraction of DP's and EP's traffic hidden behind compute
    int cp_ring;                   // CP passes K and V round a ring (overlapping attention), else all-gathers them
    int route_nodes;               // MoE: node-limited routing, each token to at most this many nodes (0: none)
    int comm_sms;                  // SMs the communication kernels take while they run beside compute (0: none)
    double tp_overlap;             // fraction of TP's traffic hidden behind the layers' matrix products
    int unfused;                   // attention as two batched products and a softmax through HBM (no FlashAttention)
    int bf16_moments;              // Adam's m and v in BF16, the gradients in FP32 (DeepSeek-V3's state), else 2 + 2 + 12 bytes
    int grad_accum_pass;           // each microbatch's BF16 gradients added into FP32 ones by a pass of their own (DeepSpeed's BF16 optimizer)
} Practice;

// Recomputation: config.h's none, selective (attention's core again, Korthikanti et al.) and
// full (every layer's forward again), as the programs take them; and norms, the cost model's
// own (DeepSeek-V3's, its report's section 3.2.3: attention's core, every RMSNorm and MLA's
// up-projections again, their outputs not kept, and SwiGLU's output recomputed from its kept
// inputs, section 3.3.3; under --fp8 what enters an FP8 product is kept in FP8, 1 byte a value).
enum { RECOMPUTE_NORMS = RECOMPUTE_FULL + 1, N_RECOMPUTE };
static const char* const cost_recompute_names[] = {"none", "selective", "full", "norms"};

typedef struct {
    int tp, cp, pp, dp, ep, zero, sp, recompute;
    int sched, V, M; // pipeline schedule (schedules.h, or dualpipe), chunks per device, microbatches (pp 1: M passes in turn)
} Layout;

// DualPipe (DeepSeek-V3's report, section 3.2.1; github.com/deepseek-ai/DualPipe), the cost
// model's own schedule beside schedules.h's, whose dualpipev is its V-shaped half: PP ranks
// (an even number), rank r holding stage r for the M/2 microbatches fed in at rank 0 and
// stage PP-1-r for the M/2 fed in at rank PP-1. Not dualpipev under another name, because
// three things the model charges differ: every device holds two stages' weights (the report:
// "two copies of the model parameters"), where dualpipev's two chunks are one stage cut in
// half; the embedding and the head (with the MTP modules) sit on both end ranks, each running
// the one for half the microbatches and the other for the rest (section 3.2.3), where
// dualpipev's rank 0 runs both for every microbatch; and PP + 1 microbatches of activations
// in flight (the report's Table 2) against dualpipev's S + 1/2. Their bubbles and their F&B
// pairs are the same to within a chunk (DualPipeV is DualPipe cut in half: its README).
enum { SCHEDULE_DUALPIPE = N_SCHEDULES, N_COST_SCHEDULES };
static const char* cost_schedule_name(int sched) { return sched == SCHEDULE_DUALPIPE ? "dualpipe" : schedule_names[sched]; }
// The schedule named `name` (schedules.h's or dualpipe), or -1.
static int cost_schedule_parse(const char* name) {
    for (int k = 0; k < N_COST_SCHEDULES; k++)
        if (!strcmp(name, cost_schedule_name(k))) return k;
    return -1;
}
// The names from schedule `first` on, joined by `sep` and the last by `last` ("a, b or c",
// "a|b|c"): messages list them from schedules.h's names, so a schedule is added once.
static void cost_schedule_list(int first, const char* sep, const char* last, char* s, size_t n) {
    size_t used = 0;
    s[0] = 0;
    for (int k = first; k < N_COST_SCHEDULES && used < n; k++)
        used += snprintf(s + used, n - used, "%s%s", k == first ? "" : k == N_COST_SCHEDULES - 1 ? last : sep, cost_schedule_name(k));
}
// Chunks (stages) a device holds: DualPipe's two stages, else schedules.h's count.
static int cost_schedule_chunks(int sched, int V) { return sched == SCHEDULE_DUALPIPE ? 2 : schedule_chunks(sched, V); }
// The forward chunks a device runs a step, per microbatch: DualPipe's one stage (M/2 each
// way), else one for each chunk it holds.
static int chunks_run(int sched, int V) { return sched == SCHEDULE_DUALPIPE ? 1 : schedule_chunks(sched, V); }

typedef struct {
    double step, compute, bubble, tp, cp, ep, pp, dp; // seconds (tp, cp, ep, dp: the exposed part)
    double membound, optimizer;                        // seconds of memory-bound work (part of compute); of the optimizer's step
    double overlap;                                    // seconds compute loses to the SMs of hidden communication (part of compute)
    double weights, acts, memory;                      // bytes per device: weights, gradients and optimizer state; activations; their sum
    double mfu, hfu, gpu_hours_per_t;                  // model FLOPs, and hardware FLOPs, / (step x devices x peak); GPU-hours per trillion tokens
    double attention;                                  // seconds of attention's core (part of compute)
    int fits;
} Cost;

static int moe_layers(const Shape* m) { return m->experts > 0 ? m->layers - m->dense : 0; }
static double head_dim(const Shape* m) { return m->head_dim > 0 ? m->head_dim : (double)m->width / m->heads; }
// widths of the attention core: Q and K (MLA adds its RoPE part), V
static double d_qk(const Shape* m) { return m->heads * (head_dim(m) + (m->kv_lora > 0 ? m->rope : 0)); }
static double d_v(const Shape* m) { return m->heads * head_dim(m); }

// Parameters of one layer's attention: Q, K, V and output projections (GQA: kv_heads of K
// and V); MLA: Q through its latent (or directly), K and V up from one shared latent, and
// the shared RoPE key.
static double attention_params(const Shape* m) {
    double h = m->width, dh = head_dim(m);
    if (m->kv_lora > 0) {
        double q = m->q_lora > 0 ? h * m->q_lora + m->q_lora * d_qk(m) : h * d_qk(m);
        return q + h * (m->kv_lora + m->rope) + m->kv_lora * m->heads * dh * 2 + d_v(m) * h;
    }
    return h * m->heads * dh + 2 * h * m->kv_heads * dh + m->heads * dh * h;
}
static double mlp_params(const Shape* m, double f) { return (m->swiglu ? 3 : 2) * (double)m->width * f; }
// Every parameter, and those that one token uses in matrix products (its routed experts
// only; not the embedding, a lookup), and those of the routed experts (sharded by EP).
static double params_total(const Shape* m) {
    double E = moe_layers(m), D = m->layers - E, h = m->width;
    double moe = h * m->experts + (m->experts + m->shared) * mlp_params(m, m->expert_ffn);
    return m->layers * (attention_params(m) + 2 * h) + D * mlp_params(m, m->ffn) + E * moe + h + 2.0 * m->vocab * h;
}
static double params_active(const Shape* m) {
    double E = moe_layers(m), D = m->layers - E, h = m->width;
    double moe = h * m->experts + (m->top_k + m->shared) * mlp_params(m, m->expert_ffn);
    return m->layers * attention_params(m) + D * mlp_params(m, m->ffn) + E * moe + h * m->vocab;
}
static double params_experts(const Shape* m) { return moe_layers(m) * (double)m->experts * mlp_params(m, m->expert_ffn); }

// FLOPs per token. The model's, for MFU: 6 per active parameter (forward 2, backward 4) and
// attention's 12 x layers x sequence x width (PaLM's count, the causal mask not subtracted).
// The hardware's, for time: the causal kernels skip the masked half of attention, and
// recomputation repeats forward work (selective: the attention core; full: every layer).
static double attention_core(const Shape* m) { return (double)m->layers * m->seq * (d_qk(m) + d_v(m)); } // forward, causal
static double model_flops(const Shape* m) { return 6 * params_active(m) + 6 * attention_core(m); }
// Parameters of MLA's up-projections (Q from its latent, K and V from theirs): what
// recomputation "norms" runs forward again.
static double up_projection_params(const Shape* m) {
    return m->kv_lora > 0 ? (m->q_lora > 0 ? (double)m->q_lora * d_qk(m) : 0) + 2.0 * m->kv_lora * m->heads * head_dim(m) : 0;
}
static double hardware_flops(const Shape* m, int recompute, double* fp8_part, int fp8) {
    double linear = params_active(m) - (double)m->width * m->vocab; // the blocks' matrix products
    double passes = recompute == RECOMPUTE_FULL ? 4 : 3;           // forward, backward's two, and the forward again
    double core = 3 * attention_core(m) + (recompute >= RECOMPUTE_SELECTIVE ? attention_core(m) : 0);
    double up = recompute == RECOMPUTE_NORMS ? 2 * m->layers * up_projection_params(m) : 0;
    *fp8_part = fp8 ? 2 * passes * linear + up : 0;
    return 2 * passes * linear + up + 6.0 * m->width * m->vocab + core;
}
// FLOPs per token in the count papers publish as hardware FLOPs (HFU; "TFLOP/s per GPU" as
// Megatron-LM prints it, Narayanan et al. 2021, eq. 3, and BLOOM and OPT after it): the
// model's count (attention's square whole) and what recomputation repeats in that count, a
// forward of every layer under full recomputation (not of the head), attention's core under
// selective. For Megatron's GPT this is its 96 B s l h^2 (1 + s/6h + V/16lh) per step.
static double hardware_count_flops(const Shape* m, int recompute) {
    double core_forward = 2 * attention_core(m); // the square whole, as the model's count takes it
    double again = recompute == RECOMPUTE_FULL ? 2 * (params_active(m) - (double)m->width * m->vocab) + core_forward
                   : recompute == RECOMPUTE_SELECTIVE ? core_forward
                   : recompute == RECOMPUTE_NORMS ? core_forward + 2 * m->layers * up_projection_params(m) : 0;
    return model_flops(m) + again;
}

// ----------------------------------------------------------------------------
// memory-bound work: what a layer moves through HBM outside its matrix products

// Bytes one layer moves between a device and its HBM per token outside its matrix products
// and attention's fused kernel: each elementwise operator reads its inputs and writes its
// outputs once, 2 bytes a value, forward, backward, and forward again under full
// recomputation. In values per token:
//   RMSNorm (2)          forward x in, y out (2h); backward x and dy in, dx out (3h)
//   residual add (2)     forward 2h in, h out; backward the two paths' gradients summed (3h)
//   RoPE                 Q's and K's rotary parts in and out, forward and backward
//   SwiGLU               forward gate and up in, their product out (3f); backward dy, gate and
//                        up in, both gradients out (5f); GELU 2f and 3f
//   MoE                  the router's E scores (2E each way); the token's k copies gathered
//                        for the experts (kh in, kh out) and combined (kh in, h out); backward
//                        the combine's (h and the k outputs in, kh out) and the gather's (kh
//                        in, h out)
//   MLA                  the two latents' RMSNorms (q_lora, kv_lora)
//   FP8 (--fp8)          every value entering an FP8 matrix product quantized from BF16 (2
//                        bytes in, 1 out: DeepSeek-V3's report, section 3.5.2, describes the
//                        round trip): forward, again for the weight gradient (tiles along the
//                        other axis), and each output gradient for the input gradient
//   norms recomputed     (recompute "norms") the norms' forward again (2h each way, and MLA's
//                        latents'), SwiGLU's forward again (3f; GELU 2f)
//   dropout (--dropout)  after attention and after the MLP: forward h in, h out and a 1-byte
//                        mask (5h bytes); backward the mask and the gradient in, it out (5h)
// Without SP the h-wide work (norms, residuals, the MoE's copies, MLA's latents, dropout) is
// done whole on every TP device; with SP it is split, and the head-split work (RoPE, the MLP,
// the quantization) always is.
static double layer_membound_bytes(const Shape* m, int moe, int tp, int sp, int recompute, int fp8) {
    double h = m->width, t = tp, again = recompute == RECOMPUTE_FULL, mla = m->kv_lora > 0;
    double k = moe ? m->top_k : 0, E = moe ? m->experts : 0, f = moe ? m->expert_ffn * (double)(m->top_k + m->shared) : m->ffn;
    double latents = mla ? (double)m->q_lora + m->kv_lora : 0;
    double wide_fwd = 4 * h + 6 * h + 2 * latents + (moe ? 2 * E + 2 * k * h + (k + 1) * h : 0);
    double wide_bwd = 6 * h + 6 * h + 3 * latents + (moe ? 2 * E + (2 * k + 1) * h + (k + 1) * h : 0);
    double rope = mla ? m->heads * (double)m->rope + m->rope : (m->heads + m->kv_heads) * head_dim(m);
    double split_fwd = 2 * rope + (m->swiglu ? 3 : 2) * f, split_bwd = 2 * rope + (m->swiglu ? 5 : 3) * f;
    double bytes = 2 * ((1 + again) * wide_fwd + wide_bwd) / (sp ? t : 1) + 2 * ((1 + again) * split_fwd + split_bwd) / t;
    if (recompute == RECOMPUTE_NORMS) // the norms' forward again, and SwiGLU's (GELU's) from its kept inputs
        bytes += 2 * (4 * h + 2 * latents) / (sp ? t : 1) + 2 * (m->swiglu ? 3 : 2) * f / t;
    if (m->dropout) bytes += 2 * ((1 + again) * 5 * h + 5 * h) / (sp ? t : 1);
    if (fp8) { // the FP8 products' inputs (each quantized once) and outputs, per token
        double in, out, up = m->swiglu ? 2 : 1;
        if (mla) {
            double q = m->q_lora > 0 ? m->q_lora : 0;
            in = h + q + m->kv_lora + d_v(m);
            out = (q > 0 ? q + d_qk(m) : d_qk(m)) + m->kv_lora + m->rope + 2.0 * m->heads * head_dim(m) + h;
        } else {
            in = h + m->heads * head_dim(m);
            out = (m->heads + 2.0 * m->kv_heads) * head_dim(m) + h;
        }
        double n = moe ? m->top_k + m->shared : 1, fe = moe ? m->expert_ffn : m->ffn;
        in += h + n * fe, out += n * (up * fe + h);
        bytes += 3 * ((2 + again) * in + out) / t;
    }
    return bytes;
}

// ----------------------------------------------------------------------------
// rates from shapes: a product's time from its M, N and K, attention's from its length

// A matrix product C (M x N) = A (M x K) B (K x N) runs as tiles of C, one a streaming
// multiprocessor at a time, in waves over the SMs (NVIDIA, "Matrix Multiplication Background
// User's Guide", 2023: section 2.3, cuBLAS's most efficient tiles are 256 x 128 and 128 x 256;
// section 3, tile and wave quantization). A tile at the edge computes a whole tile, and the
// last wave keeps only some SMs busy: the rate is the best product's (the cluster file's
// `efficiency`, a benchmark's best shape) times the share of the waves' tile work that is C's,
// for the better of the two tiles. A dimension smaller than its tile takes a tile of its own
// size rounded up to 16 (the tensor cores' m16n8k16 instruction), and a product of fewer
// tiles than SMs splits K among them (split-K, chunks of 256 at least), as cuBLAS does for
// skinny products. 1 when the cluster file gives no SMs.
enum { TILE_LONG = 256, TILE_SHORT = 128, TILE_MIN = 16, SPLIT_K_CHUNK = 256 };
static double wave_fraction(const Cluster* c, double batch, double M, double N, double K) {
    if (c->sms <= 0) return 1;
    double best = 0;
    for (int o = 0; o < 2; o++) {
        double tm = fmin(o ? TILE_SHORT : TILE_LONG, TILE_MIN * ceil(M / TILE_MIN));
        double tn = fmin(o ? TILE_LONG : TILE_SHORT, TILE_MIN * ceil(N / TILE_MIN));
        double tiles = batch * ceil(M / tm) * ceil(N / tn);
        double splits = fmax(1, fmin(floor(c->sms / tiles), ceil(K / SPLIT_K_CHUNK))), units = tiles * splits;
        double waves = ceil(units / c->sms);
        best = fmax(best, batch * M * N / (tiles * tm * tn) * units / (waves * c->sms));
    }
    return best;
}
// Seconds of `batch` products (M x K by K x N): the longer of their FLOPs at the rate the
// shape reaches and their bytes through HBM (A and B read, C written once: a skinny product,
// few rows of tokens against a large weight, is memory-bound, the roofline). FP8 inputs are
// 1 byte and run at the FP8 rate, whose figure was measured on DeepSeek-V3's own shapes
// (the cluster file): no quantization is taken off it again. Every rate is a benchmark's
// burst; a training run holds its devices at their power limit, where the clock settles
// lower: the cluster file's sustained_fraction of it (1 where none is published).
static double gemm_seconds(const Cluster* c, double batch, double M, double N, double K, int fp8) {
    if (batch <= 0 || M <= 0 || N <= 0 || K <= 0) return 0;
    double flops = 2 * batch * M * N * K;
    double rate = c->sustained * (fp8 ? c->fp8_flops * c->fp8_efficiency : c->flops * c->efficiency * wave_fraction(c, batch, M, N, K));
    double bytes = batch * ((fp8 ? 1 : 2) * (M * K + K * N) + 2 * M * N);
    return fmax(flops / rate, bytes / c->hbm);
}
// A linear layer (in -> out) on T tokens: forward (T x in by in x out) `forwards` times (2
// under full recomputation), the input's gradient (T x out by out x in) and the weight's
// (in x T by T x out).
static double linear_seconds(const Cluster* c, double batch, double T, double in, double out, int fp8, double forwards) {
    return forwards * gemm_seconds(c, batch, T, out, in, fp8) + gemm_seconds(c, batch, T, in, out, fp8) +
           gemm_seconds(c, batch, in, out, T, fp8);
}
// Attention's fused kernel (FlashAttention) at a sequence of `seq` keys: the cluster file's
// rate for long sequences, less at short ones, where a causal kernel's diagonal tiles and each
// row block's fixed work weigh more: rate x seq / (seq + attention_half_seq).
static double attention_rate(const Cluster* c, double seq) {
    return c->sustained * c->flops * c->attention_efficiency * seq / (seq + c->attention_half_seq);
}

// Seconds of one layer (MoE or dense) for a microbatch of `seqs` sequences on one device,
// split by TP (columns of the first products, rows of the second; every product's FLOPs / TP)
// and CP (1/CP of the positions): its products at their shapes, attention's core, and the
// memory-bound work; *core and *membound get those two parts.
static double layer_seconds(const Cluster* c, const Shape* m, const Practice* pr, const Layout* l, int moe, double seqs,
                            double* core, double* membound) {
    double t = l->tp, T = seqs * m->seq / l->cp, h = m->width, dh = head_dim(m), again = l->recompute == RECOMPUTE_FULL;
    double fw = 1 + again;
    int f8 = pr->fp8;
    double s = 0;
    // attention's projections
    if (m->kv_lora > 0) { // MLA: Q through its latent (or directly), K and V up from the shared latent
        if (m->q_lora > 0) s += linear_seconds(c, 1, T, h, m->q_lora / t, f8, fw) + linear_seconds(c, 1, T, m->q_lora, d_qk(m) / t, f8, fw);
        else s += linear_seconds(c, 1, T, h, d_qk(m) / t, f8, fw);
        s += linear_seconds(c, 1, T, h, (m->kv_lora + m->rope) / t, f8, fw);
        s += linear_seconds(c, 1, T, m->kv_lora, 2.0 * m->heads * dh / t, f8, fw);
        if (l->recompute == RECOMPUTE_NORMS) // the up-projections' forward again
            s += (m->q_lora > 0 ? gemm_seconds(c, 1, T, d_qk(m) / t, m->q_lora, f8) : 0) +
                 gemm_seconds(c, 1, T, 2.0 * m->heads * dh / t, m->kv_lora, f8);
    } else {
        s += linear_seconds(c, 1, T, h, (m->heads + 2.0 * m->kv_heads) * dh / t, f8, fw); // the fused QKV
    }
    s += linear_seconds(c, 1, T, d_v(m) / t, h, f8, fw); // the output projection
    // the MLP: up (and gate) and down; MoE: the router, the shared experts on every token,
    // and the routed experts, E / EP on a device, each with the tokens of the EP group routed to it
    double up = m->swiglu ? 2 : 1;
    if (!moe) {
        s += linear_seconds(c, 1, T, h, up * m->ffn / t, f8, fw) + linear_seconds(c, 1, T, m->ffn / t, h, f8, fw);
    } else {
        double fe = m->expert_ffn, local = (double)m->experts / l->ep, Te = T * m->top_k * l->ep / m->experts;
        s += linear_seconds(c, 1, T, h, m->experts / t, 0, fw);
        if (m->shared > 0)
            s += linear_seconds(c, 1, T, h, up * fe * m->shared / t, f8, fw) + linear_seconds(c, 1, T, fe * m->shared / t, h, f8, fw);
        s += linear_seconds(c, local, Te, h, up * fe / t, f8, fw) + linear_seconds(c, local, Te, fe / t, h, f8, fw);
    }
    // attention's core: a fused kernel at its rate for the sequence (CP: a device's positions
    // against the keys), forward, backward (2), and forward again under any recomputation;
    // unfused (--attention unfused), two batched products a head and sequence (Q K^T, P V;
    // backward four more) over the whole square, the causal mask applied after, and the
    // softmax's scores through HBM (forward scores in, probabilities out; backward
    // probabilities and their gradient in, the scores' out)
    double passes = 3 + (l->recompute >= RECOMPUTE_SELECTIVE);
    double a;
    if (!pr->unfused) {
        a = passes * T * m->seq * (d_qk(m) + d_v(m)) / t / attention_rate(c, (double)m->seq / l->cp);
    } else {
        double heads = m->heads / t, qk = d_qk(m) / m->heads, v = d_v(m) / m->heads, B = seqs * heads, Sq = (double)m->seq / l->cp, Sk = m->seq;
        // with dropout on the probabilities (--dropout): forward its mask (1 byte) and the
        // dropped probabilities out, backward the mask and their gradient in, 3 bytes each way
        double drop = m->dropout ? 3 : 0;
        double fwd = gemm_seconds(c, B, Sq, Sk, qk, 0) + gemm_seconds(c, B, Sq, v, Sk, 0) + B * Sq * Sk * (2 * 2 + drop) / c->hbm;
        double bwd = gemm_seconds(c, B, Sq, Sk, v, 0) + gemm_seconds(c, B, Sk, v, Sq, 0) + gemm_seconds(c, B, Sq, qk, Sk, 0) +
                     gemm_seconds(c, B, Sk, qk, Sq, 0) + B * Sq * Sk * (3 * 2 + drop) / c->hbm;
        a = (passes - 2) * fwd + bwd;
    }
    double mb = T * layer_membound_bytes(m, moe, l->tp, l->sp, l->recompute, pr->fp8) / c->hbm;
    *core = a, *membound = mb;
    return s + a + mb;
}

// ----------------------------------------------------------------------------
// memory

// Bytes of activations one layer keeps for backward, per token on one device, Korthikanti
// et al.'s accounting term by term (2 bytes a value, 1 a dropout mask); s_kv: the keys
// each query attends to. Their GPT (MHA, GELU 4h, dropout) gives 34h + 5as, and TP without
// SP 10h + 24h/t + 5as/t; SP divides all by t; selective recomputation drops the as terms.
// Replicated (without SP) are the inputs of the norms and of the first matrix product of
// each block and the output dropout masks; the rest is split across TP. Recomputation
// "norms" (DeepSeek-V3) keeps neither the norms' outputs (the first products' inputs) nor
// MLA's up-projected Q, K and V, nor SwiGLU's output; under FP8 (`fp8`) the inputs of FP8
// products it keeps (the latents, the output projection's input, SwiGLU's inputs, the
// dispatched copies) are 1 byte a value.
static double layer_acts_per_token(const Shape* m, int moe, int tp, int sp, int recompute, double s_kv, int fp8) {
    double h = m->width, t = tp, a = m->heads, drop = m->dropout, mla = m->kv_lora > 0;
    double f = moe ? m->expert_ffn * (double)(m->top_k + m->shared) : m->ffn;
    if (recompute == RECOMPUTE_NORMS) {
        double b = fp8 ? 1 : 2;                                       // a kept product input's bytes
        double rep = 2 * (h + h) + 2 * drop * h;                      // the norms' inputs; dropout masks
        double split = b * d_v(m);                                    // the output projection's input
        if (mla) split += b * (m->kv_lora + m->rope + m->q_lora);     // the latents (Q, K, V recomputed from them)
        else split += 2 * d_qk(m) + 2 * 2 * m->kv_heads * head_dim(m); // Q, K, V
        split += b * (m->swiglu ? 2 : 1) * f;                         // SwiGLU's (GELU's) inputs
        if (moe) split += b * h * m->top_k;                           // the dispatched copies
        return (sp ? rep / t : rep) + split / t;
    }
    double rep = 2 * (2 * h + 2 * h) + 2 * drop * h; // attention and MLP: norm input, first matrix input; output dropout masks
    double k = mla ? d_qk(m) : m->kv_heads * head_dim(m), v = mla ? d_v(m) : m->kv_heads * head_dim(m);
    double split = 2 * d_qk(m) + 2 * k + 2 * v + 2 * d_v(m); // Q, K, V, the output projection's input
    if (mla) split += 2.0 * (m->kv_lora + m->rope + m->q_lora); // MLA's latents
    split += m->swiglu ? 2 * (2 * f) + 2 * f : 2 * f + 2 * f; // SwiGLU: gate and up, their product; GELU: its input, output
    if (moe) split += 2 * h * m->top_k;                       // the token's dispatched copies
    double scores = recompute >= RECOMPUTE_SELECTIVE ? 0 : a * s_kv * (2 + 3 * drop); // softmax output (+ mask, dropped output)
    return (sp ? rep / t : rep) + split / t + scores / t;
}
static double layer_acts(const Shape* m, int tp, int sp, int recompute, int fp8) { // per token, averaged over dense and MoE layers
    double moe = (double)moe_layers(m) / m->layers;
    return (1 - moe) * layer_acts_per_token(m, 0, tp, sp, recompute, m->seq, fp8) +
           moe * layer_acts_per_token(m, 1, tp, sp, recompute, m->seq, fp8);
}

// Activations device r of the pipeline holds at its peak, in bytes: per microbatch and
// layer, times the layers of its stage (n[r]) and the microbatches its schedule keeps
// (schedules.h; zbv: the checker's, passed as zbv_peak; DualPipe: PP + 1 of a stage, the
// report's Table 2, a stage being the average of the device's two); the FP32 logits on the
// device with the head (the last; zbv: device 0; DualPipe: both ends). Full recomputation
// keeps each layer's input only, and the working set of the one layer that backward recomputes.
static double stage_activation_bytes(const Shape* m, const Layout* l, const int* n, int r, double zbv_peak, int fp8) {
    double seqs_mb = m->tokens / m->seq / l->dp / l->M, tokens = seqs_mb * m->seq / l->cp;
    int S = l->pp;
    double layer = tokens * layer_acts(m, l->tp, l->sp, l->recompute, fp8), logits = 4.0 * tokens * m->vocab / l->tp, once = 0;
    if (l->recompute == RECOMPUTE_FULL) {
        layer = tokens * 2.0 * m->width / (l->sp ? l->tp : 1);
        once = tokens * layer_acts(m, l->tp, l->sp, RECOMPUTE_SELECTIVE, fp8);
    }
    if (S > 1 && l->sched == SCHEDULE_DUALPIPE)
        return (S + 1) * (n[r] + n[S - 1 - r]) / 2.0 * layer + once + (r == 0 || r == S - 1 ? logits : 0);
    double held = S == 1 ? 1 : l->sched == SCHEDULE_ZBV ? zbv_peak : schedule_peak_formula(l->sched, S, l->V, l->M, r);
    int last = schedule_v_shaped(l->sched) ? r == 0 : r == S - 1; // a V ends where it starts
    return held * n[r] * layer + once + (last ? logits : 0);
}

// Weights, gradients and optimizer state on one device: 2 + 2 + 12 bytes per parameter,
// ZeRO stage 1 sharding the 12, stage 2 the gradients too, stage 3 the weights too, over the
// devices holding the same parameters: DP x CP for the dense ones, DP x CP / EP for experts.
// DeepSeek-V3's (--bf16-moments; its report, section 3.3.3): Adam's two moments in BF16,
// the master weights and the gradients (accumulated over microbatches) in FP32: 2 + 4 + 8.
static double state_bytes_as(double params, int zero, double shards, int bf16_moments) {
    double grad = bf16_moments ? 4 : 2, opt = bf16_moments ? 4 + 2 + 2 : 12;
    return params * ((zero >= 3 ? 2 / shards : 2) + (zero >= 2 ? grad / shards : grad) + (zero >= 1 ? opt / shards : opt));
}
static double state_bytes(double params, int zero, double shards) { return state_bytes_as(params, zero, shards, 0); }
// The optimizer's step over the parameters a device updates (its ZeRO shard, or all it holds):
// Adam reads the FP32 master weight, m, v and the 2-byte gradient and writes the three and
// the 2-byte weight, 28 bytes a parameter, memory-bound (--bf16-moments: m and v 2 bytes
// each way, the gradient 4 in: 22).
enum { OPTIMIZER_BYTES = 4 + 4 + 4 + 2 + 4 + 4 + 4 + 2, OPTIMIZER_BYTES_BF16_MOMENTS = 4 + 2 + 2 + 4 + 4 + 2 + 2 + 2 };
static double optimizer_params(double params, int zero, double shards) { return zero >= 1 ? params / shards : params; }
// Gradients accumulated in FP32 by a pass of their own, after each microbatch's backward
// (--grad-accum-pass): DeepSpeed's BF16 optimizer, which BLOOM trained with, does it in its
// pipeline engine (PipelineEngine._exec_backward_pass calls BF16_Optimizer.update_hp_grads
// after every microbatch: hp_grad.add_(lp.grad.to(float32)) for each parameter). The BF16
// gradient read and written as an FP32 copy (2 + 4), the copy and the FP32 gradient read and
// the sum written (4 + 4 + 4): 18 bytes a parameter the device holds, memory-bound, every
// microbatch (its clear_lp_grads before each backward sets the BF16 gradients to None in
// the versions of 2022, no traffic). The FP32 gradients are held whole beside the BF16 ones,
// 4 bytes a parameter more (ZeRO-2 and 3 would shard them). Megatron-LM fuses the sum into
// the weight-gradient product (its gradient_accumulation_fusion: the product accumulates into
// the FP32 gradient), no pass.
enum { GRAD_ACCUM_BYTES = 2 + 4 + 4 + 4 + 4 };
// The parameters on one device of a stage of n layers (the layers' average: the dense ones
// apart from the routed experts, which EP shares out), with the embedding on the first
// device and the head and final norm on the last (zbv: both on device 0).
static void stage_params(const Shape* m, const Layout* l, int n, int embedding, int head, double* dense, double* experts) {
    double h = m->width, ends = h + 2.0 * m->vocab * h, per_dense = (params_total(m) - params_experts(m) - ends) / m->layers;
    double moe = moe_layers(m) > 0, per_experts = moe ? params_experts(m) / moe_layers(m) : 0;
    double mtp = head ? m->mtp : 0; // the MTP modules (a block like the last, a 2h x h projection, two norms) with the head
    *dense = (n * per_dense + (embedding ? m->vocab * h : 0) + (head ? m->vocab * h + h : 0) + mtp * (per_dense + 2 * h * h + 2 * h)) / l->tp;
    *experts = (n * params_experts(m) / m->layers + mtp * per_experts) / l->tp / l->ep;
}
// The parameters device r of the pipeline holds, its stage's layers n[r] (stage_layers):
// under DualPipe two stages, r's and PP-1-r's, and both ends on the two end ranks; else the
// embedding on the first device and the head on the last (a V: both on device 0).
static void device_params(const Shape* m, const Layout* l, const int* n, int r, double* dense, double* experts) {
    int last = l->pp - 1;
    int end = r == 0 || r == last;
    if (l->pp > 1 && l->sched == SCHEDULE_DUALPIPE) stage_params(m, l, n[r] + n[last - r], end, end, dense, experts);
    else stage_params(m, l, n[r], r == 0, l->pp == 1 || schedule_v_shaped(l->sched) ? r == 0 : r == last, dense, experts);
}

// ----------------------------------------------------------------------------
// the pipeline's stages

// How many layers each device of the pipeline holds (n[S]), balanced by their time: the
// first device also does the embedding's work (e, in layers' time), the last the head's and
// the loss's (hh); under zbv device 0 holds both ends (`together`). The pipeline runs at
// its slowest device's pace, which is returned, in layers' time. Meta took a layer off the
// first and last of Llama 3 405B's 16 stages for this (7, 8 x 14, 7 of its 126); any
// implementation may split unevenly (Megatron's first- and last-stage layer counts).
static double stage_layers(int L, int S, double e, double hh, int together, int* n) {
    double extra_first = together || S == 1 ? e + hh : e, extra_last = together ? 0 : hh;
    double pace = -1;
    // the smallest pace at which whole layers cover L: it is an integer plus one of the ends
    const double offsets[] = {0, e, hh, e + hh};
    for (int k = (int)fmax(0, floor((double)L / S - e - hh)); pace < 0 || k <= pace; k++)
        for (int i = 0; i < 4; i++) {
            double P = k + offsets[i];
            long cover = 0;
            for (int r = 0; r < S; r++) {
                double extra = r == 0 ? extra_first : r == S - 1 ? extra_last : 0;
                cover += (long)fmax(0, floor(P - extra + 1e-9));
            }
            if (cover >= L && (pace < 0 || P < pace)) pace = P;
        }
    // whole layers at that pace, the surplus taken from the fullest devices, earliest first
    // (the early stages hold the most microbatches)
    long total = 0;
    for (int r = 0; r < S; r++) {
        double extra = r == 0 ? extra_first : r == S - 1 ? extra_last : 0;
        n[r] = (int)fmax(0, floor(pace - extra + 1e-9)), total += n[r];
    }
    for (; total > L; total--) {
        int most = 0;
        for (int r = 1; r < S; r++)
            if (n[r] > n[most]) most = r;
        n[most]--;
    }
    pace = 0;
    for (int r = 0; r < S; r++) pace = fmax(pace, n[r] + (r == 0 ? extra_first : r == S - 1 ? extra_last : 0));
    return pace;
}

// Memory-bound bytes per token of the two ends, on one device. The embedding: its row
// gathered (h in, h out) and, backward, the gradient added into the row's (dy, the row's
// gradient in, it out), whole on every TP device (each looks up its part of the vocabulary
// and writes the whole width). The head: the final RMSNorm (as a layer's), and the loss over
// the vocabulary (split across TP): the BF16 logits cast to FP32 (2V in, 4V out), their
// maximum (4V in) and the exponentials' sum (4V in); backward, the softmax less the target
// from the kept FP32 logits (4V in) written as the BF16 gradient (2V out).
static double embedding_membound_bytes(const Shape* m) { return 2 * 5.0 * m->width; }
static double head_membound_bytes(const Shape* m, int tp, int sp) {
    return 2 * 5.0 * m->width / (sp ? tp : 1) + 20.0 * m->vocab / tp;
}

// ----------------------------------------------------------------------------
// communication: the alpha-beta model of the collectives

// A link as NCCL's own model of it (src/graph/tuning.cc): a collective costs a base latency,
// then each of its steps a latency and its bytes at the link's bandwidth. Small messages so
// reach less than the bandwidth, and more devices take more steps: the bus bandwidth by
// message size and group size that nccl-tests prints follows from these three numbers.
typedef struct {
    double alpha, beta, base; // seconds a step; bytes per second; seconds a collective
} Link;

// A ring all-reduce of `bytes` over n devices: 2(n-1) steps, each a message of bytes/n.
static double t_allreduce(double bytes, int n, Link k) {
    return n <= 1 ? 0 : k.base + 2.0 * (n - 1) * (k.alpha + bytes / n / k.beta);
}
// A ring all-gather or reduce-scatter whose whole buffer is `bytes`: n-1 steps.
static double t_half(double bytes, int n, Link k) {
    return n <= 1 ? 0 : k.base + (n - 1.0) * (k.alpha + bytes / n / k.beta);
}
static double t_p2p(double bytes, Link k) { return k.alpha + bytes / k.beta; }

// The link of a group of n devices `stride` ranks apart (TP's: stride 1; CP's: TP; the data
// axis's D x C: TP; the pipeline's: TP x CP x DP). Ranks fill the nodes in order, so the
// groups of an axis are blocks of n x stride consecutive ranks: a group lies in one node when
// its block divides the node (NVLink), else it crosses between nodes, where a node's NICs
// (nics_per_node, each at inter_gbytes_per_s) are shared by every ring leaving the node at
// once: all the axis's groups run together, one ring for each group with members in the node.
static Link ring_link(const Cluster* c, int n, long stride) {
    Link k = {c->alpha_intra, c->beta_intra, c->collective_latency};
    double extent = (double)n * stride;
    if (n <= 1 || (extent <= c->per_node && c->per_node % (long)extent == 0)) return k;
    double in_node = fmax(1, fmin(n, floor((double)c->per_node / stride))), streams = c->per_node / in_node;
    k.alpha = c->alpha_inter, k.beta = c->beta_inter * fmin(1, c->nics / streams);
    return k;
}
// What one device gets of its node's NICs when every device of the node sends at once
// (all-to-alls, pipeline sends between nodes).
static double nic_share(const Cluster* c) { return fmin(1, (double)c->nics / c->per_node); }

// An all-to-all over EP devices, each sending `bytes` spread evenly over the group (1/ep
// stays home): the part for devices of its own node over the node's links, the rest between
// nodes, both at once; a message to each of the others. `remote` scales the part between
// nodes: node-limited routing sends a token once to each node it reaches (route_scale).
static double t_alltoall(const Cluster* c, double bytes, int ep, int stride, double remote) {
    if (ep <= 1) return 0;
    int in_node = c->per_node / stride < 1 ? 1 : c->per_node / stride; // devices of the group in one node
    if (in_node > ep) in_node = ep;
    double local = bytes * (in_node - 1) / ep, far = bytes * (ep - in_node) / ep * remote;
    double alpha = ep > in_node ? c->alpha_inter : c->alpha_intra;
    return c->collective_latency + (ep - 1) * alpha + fmax(local / c->beta_intra, far / (c->beta_inter * nic_share(c)));
}
// Node-limited routing (DeepSeek-V3): a token's k experts lie on at most R of the group's
// nodes, and it crosses to each of those nodes once (then NVLink forwards it): min(R, nodes)
// copies of k cross. Without it (R 0), every copy travels on its own.
static double route_scale(const Cluster* c, const Shape* m, int ep, int stride, int R) {
    int in_node = c->per_node / stride < 1 ? 1 : c->per_node / stride, nodes = ep / (in_node < ep ? in_node : ep);
    return R > 0 ? fmin(1.0, fmin(R, nodes) / (double)m->top_k) : 1;
}

// ----------------------------------------------------------------------------
// one layout

// The pipeline's bubble (schedules.h), with forward, input-gradient and weight-gradient
// halves of equal time (full recomputation adds a forward to the input half); zbv has no
// closed form: the caller passes what schedules.h's checker measured. An F&B (DualPipe's,
// dualpipev's) counts as F + B here: where a pair's traffic outlasts its compute, the excess
// is already in the step's exposed EP and PP time, which the bubble's fraction stretches.
// DualPipe's: (PP/2 - 1)(F&B + B - 3W) idle beside a device's M (F + B) of work (DeepSeek-V3's
// report, Table 2).
static Durations pipeline_durations(int recompute) { return (Durations){.f = 1, .i = recompute == RECOMPUTE_FULL ? 2 : 1, .w = 1}; }
static double pipeline_bubble(const Layout* l, double zbv_bubble) {
    if (l->pp <= 1) return 0;
    if (l->sched == SCHEDULE_ZBV) return zbv_bubble;
    Durations d = pipeline_durations(l->recompute);
    d.fb = d.f + d.i + d.w;
    if (l->sched == SCHEDULE_DUALPIPE) {
        double idle = (l->pp / 2.0 - 1) * (d.fb + d.i + d.w - 3 * d.w);
        return idle / (l->M * (d.f + d.i + d.w) + idle);
    }
    return schedule_bubble_formula(l->sched, l->pp, l->V, l->M, d);
}
// The share of a device's forward chunks that run as an F&B, overlapped with the backward
// chunk of another microbatch: its all-to-alls and pipeline sends run while the other's
// attention and MLP compute and the other way round (the report's Figure 4), so the pair
// takes the longer of its compute and its traffic, not their sum. Counted on the end ranks,
// which pair the fewest (and hold the ends): DualPipe's ranks 0 and PP-1 run M - 3PP/2 + 1
// of their M forwards as F&Bs (deepseek-ai/DualPipe, dualpipe.py: its steps 4 and 5,
// 2(M/2 - PP + 1) + PP/2 - 1; at PP 2 both ranks are its "middle" ranks, whose first F&B of
// step 4 runs unpaired: M - 3); dualpipev's rank 0 of S, 2M - 3S + 1 of its 2M (schedules.h's
// lists). The warm-up's forwards and the cool-down's backwards run alone. 0: no pairs.
static double paired_fraction(const Layout* l) {
    if (l->pp <= 1) return 0;
    if (l->sched == SCHEDULE_DUALPIPE) return fmax(0, (l->M - 1.5 * l->pp + (l->pp == 2 ? 0 : 1)) / l->M);
    if (l->sched == SCHEDULE_DUALPIPEV) return fmax(0, (2.0 * l->M - 3 * l->pp + 1) / (2.0 * l->M));
    return 0;
}

static double hidden(double overlap, double traffic, double compute) { return fmin(overlap * traffic, compute); }
// Traffic hidden behind one stretch of compute: each kind already at most its own share of
// the stretch (what it may hide behind), and all of them together at most the stretch: a
// device's compute runs once, however many transfers run beside it. What exceeds shows,
// taken from each kind in proportion to what it would hide.
static void share_stretch(double stretch, double* hide, int n) {
    double sum = 0;
    for (int i = 0; i < n; i++) sum += hide[i];
    if (sum > stretch)
        for (int i = 0; i < n; i++) hide[i] *= stretch / sum;
}

// The stages' most: a pipeline of up to this many stages (any number, not only powers of 2).
enum { MAX_STAGES = 256 };

static Cost layout_cost(const Cluster* c, const Shape* m, const Practice* pr, const Layout* l, int devices,
                        double zbv_bubble, double zbv_peak) {
    Cost k = {0};
    // compute, per token on one device, from a microbatch's products at their shapes (the
    // blocks' in FP8 under --fp8), attention's core at its kernel's rate for the sequence,
    // and the memory-bound work: a layer (dense and MoE layers in their proportion), the
    // head's product (BF16) and the loss, the embedding's lookup
    double seqs_mb = m->tokens / m->seq / l->dp / l->M, tokens = seqs_mb * m->seq / l->cp, h = m->width;
    double moe = (double)moe_layers(m) / m->layers, core_d = 0, mb_d = 0, core_e = 0, mb_e = 0;
    double layer_mb = (1 - moe) * layer_seconds(c, m, pr, l, 0, seqs_mb, &core_d, &mb_d) +
                      (moe > 0 ? moe * layer_seconds(c, m, pr, l, 1, seqs_mb, &core_e, &mb_e) : 0);
    double layer_s = layer_mb / tokens, att_s = ((1 - moe) * core_d + moe * core_e) / tokens;
    double mb_s = ((1 - moe) * mb_d + moe * mb_e) / tokens;
    double head_s = linear_seconds(c, 1, tokens, h, (double)m->vocab / l->tp, 0, 1) / tokens +
                    head_membound_bytes(m, l->tp, l->sp) / c->hbm;
    // multi-token prediction (DeepSeek-V3's report, section 2.2: D modules, each a projection
    // of 2h to h, a block like the last layer and the shared head and loss again), on the
    // device with the head (section 3.2.3); the model's FLOPs (MFU) leave it out
    if (m->mtp > 0) {
        double last = (moe > 0 ? (layer_seconds(c, m, pr, l, 1, seqs_mb, &core_e, &mb_e)) : layer_mb) / tokens;
        head_s += m->mtp * (head_s + last + linear_seconds(c, 1, tokens, 2.0 * h, h / l->tp, pr->fp8, 1 + (l->recompute == RECOMPUTE_FULL)) / tokens);
    }
    double embedding_s = embedding_membound_bytes(m) / c->hbm;
    // the stages, balanced (unevenly where the layers do not divide); the pipeline at the
    // slowest one's pace, for the tokens of a TP group
    int n[MAX_STAGES], together = l->pp == 1 || schedule_v_shaped(l->sched), dual = l->pp > 1 && l->sched == SCHEDULE_DUALPIPE;
    if (l->pp > MAX_STAGES || l->pp < 1) fatal("internal: %d pipeline stages, more than the model takes", l->pp);
    if (dual && l->pp % 2) fatal("internal: dualpipe with an odd PP (%d)", l->pp);
    double pace, per_stage = 0; // per_stage: the most layers a device runs for a microbatch, whose communication sets the pace
    if (dual) {
        // DualPipe: ranks r and PP-1-r hold the same two stages and each runs one of them for
        // half the microbatches, the other for the rest: per microbatch, half the pair's
        // layers and (the end pair) half of both ends. The pairs balanced as a V of PP/2.
        int pairs[MAX_STAGES];
        pace = stage_layers(m->layers, l->pp / 2, embedding_s / layer_s, head_s / layer_s, 1, pairs) / 2;
        for (int r = 0; r < l->pp / 2; r++)
            n[r] = (pairs[r] + 1) / 2, n[l->pp - 1 - r] = pairs[r] / 2, per_stage = fmax(per_stage, pairs[r] / 2.0);
    } else {
        pace = stage_layers(m->layers, l->pp, embedding_s / layer_s, head_s / layer_s, together, n);
        for (int r = 0; r < l->pp; r++) per_stage = fmax(per_stage, n[r]);
    }
    double group_tokens = m->tokens / l->dp / l->cp;
    k.compute = group_tokens * pace * layer_s;
    k.membound = group_tokens * per_stage * mb_s;
    k.attention = group_tokens * per_stage * att_s;
    double M = l->M; // (doubles: no int product overflows)
    if (pr->grad_accum_pass) { // every microbatch, on the device that holds the most; compute, as the rest, that traffic may hide behind
        double most = 0;
        for (int r = 0; r < l->pp; r++) {
            double dense, experts;
            device_params(m, l, n, r, &dense, &experts);
            most = fmax(most, dense + experts);
        }
        double pass = M * most * GRAD_ACCUM_BYTES / c->hbm;
        k.compute += pass, k.membound += pass;
    }
    // TP: 2 all-reduces of a microbatch's activations per layer forward, 2 backward, 2 more
    // when the forward runs again; a stated fraction hidden behind the products (--tp-overlap)
    double n_tp = 4 + (l->recompute == RECOMPUTE_FULL ? 2 : 0);
    double tp = per_stage * M * n_tp * t_allreduce(2 * tokens * h, l->tp, ring_link(c, l->tp, 1));
    double tp_alone = hidden(pr->tp_overlap, tp, k.compute - k.membound - k.attention); // were nothing else hidden
    // CP: K and V of the whole sequence gathered forward and again backward, their gradients
    // reduce-scattered (and gathered once more under full recomputation); a ring moves the
    // same bytes in cp-1 steps while attention computes, hiding up to the attention's time
    double kv = m->kv_lora > 0 ? (d_qk(m) + d_v(m)) / l->tp // K and V widths on one TP device (GQA: a head at least)
                : m->kv_heads >= l->tp ? 2.0 * m->kv_heads * head_dim(m) / l->tp : 2 * head_dim(m);
    double kv_bytes = 2 * seqs_mb * m->seq * kv;
    double cp = per_stage * M * (3 + (l->recompute == RECOMPUTE_FULL)) * t_half(kv_bytes, l->cp, ring_link(c, l->cp, l->tp));
    double cp_alone = pr->cp_ring ? fmin(cp, k.attention) : 0;
    // EP: per MoE layer and microbatch, dispatch (FP8 under --fp8) and combine forward, and
    // their gradients backward: each device sends its tokens' copies, top-k per token
    double moe_per_stage = per_stage * moe;
    double copies = tokens / l->tp * m->top_k * h;
    int stride = l->tp * l->cp;
    double far = route_scale(c, m, l->ep, stride, pr->route_nodes);
    double dispatch = t_alltoall(c, copies * (pr->fp8 ? 1 : 2), l->ep, stride, far), other = t_alltoall(c, copies * 2, l->ep, stride, far);
    double a2a = dispatch + 3 * other + (l->recompute == RECOMPUTE_FULL ? dispatch + other : 0);
    double ep = moe_per_stage * M * a2a;
    // PP: a microbatch's activations (scattered across TP under SP) over each boundary,
    // forward and back: the sends of one device's chunks and of the fill on the critical path
    double V = l->pp > 1 ? chunks_run(l->sched, l->V) : 0;
    Link pp_link = ring_link(c, l->pp, (long)l->tp * l->cp * l->dp);
    double send = t_p2p(2 * tokens * h / (l->sp ? l->tp : 1), pp_link), pp = l->pp > 1 ? 2.0 * (V * M + l->pp - 2) * send : 0;
    // an F&B (DualPipe, dualpipev) hides its chunks' all-to-alls and sends behind its compute:
    // the paired share of each; the rest of EP as --ep-overlap says, behind the rest of the
    // compute. TP's and CP's hidden traffic runs in every chunk, paired or not, beside the
    // same compute: each stretch (the pairs', the rest's) hides at most its own length of
    // traffic in all (share_stretch)
    double paired = paired_fraction(l);
    double in_pairs[4] = {paired * tp_alone, paired * cp_alone, paired * ep, paired * 2 * V * M * send};
    double rest[4] = {(1 - paired) * tp_alone, (1 - paired) * cp_alone, hidden(pr->ep_overlap, (1 - paired) * ep, (1 - paired) * k.compute), 0};
    share_stretch(paired * k.compute, in_pairs, 4);
    share_stretch((1 - paired) * k.compute, rest, 4);
    double tp_hidden = in_pairs[0] + rest[0], cp_hidden = in_pairs[1] + rest[1], ep_hidden = in_pairs[2] + rest[2], pp_hidden = in_pairs[3];
    k.tp = tp - tp_hidden, k.cp = cp - cp_hidden, k.ep = ep - ep_hidden, k.pp = pp - pp_hidden;
    k.bubble = pipeline_bubble(l, zbv_bubble);
    // DP: an all-reduce's time for the gradients (reduce-scatter, then all-gather of the
    // weights), 1.5 times under ZeRO-3; dense weights over DP x CP, experts over DP x CP / EP;
    // then the optimizer's step. Each stage's own, the slowest sets the step's end. DualPipe:
    // a device's two stages, each copy with its own state, and the two copies' gradients
    // summed by one exchange of each device's reduced shard with the device holding the other
    // copy (the same bytes as one ring over both copies' replicas)
    Link dp_link = ring_link(c, l->dp * l->cp, l->tp), edp_link = ring_link(c, l->dp / l->ep * l->cp, (long)l->tp * l->ep);
    double shards = (double)l->dp * l->cp, expert_shards = (double)l->dp / l->ep * l->cp, dp = 0;
    for (int r = 0; r < l->pp; r++) {
        double dense, experts, t;
        device_params(m, l, n, r, &dense, &experts);
        t = t_allreduce(2 * dense, l->dp * l->cp, dp_link) + (m->experts > 0 ? t_allreduce(2 * experts, l->dp / l->ep * l->cp, edp_link) : 0);
        t *= l->zero == 3 ? 1.5 : 1; // ZeRO-3 gathers the weights again for backward
        if (dual) t += t_p2p(2 * dense / shards + 2 * experts / expert_shards, pp_link); // once: the copies' gradients
        double opt = (pr->bf16_moments ? OPTIMIZER_BYTES_BF16_MOMENTS : OPTIMIZER_BYTES) / c->hbm * (optimizer_params(dense, l->zero, shards) + optimizer_params(experts, l->zero, expert_shards));
        if (t + opt > dp + k.optimizer) dp = t, k.optimizer = opt;
    }
    // hidden (--dp-overlap) behind the compute that runs while it can: the gradients are
    // reduce-scattered during the last microbatch's backward and the weights gathered during
    // the first one's forward (Megatron-LM's distributed optimizer; MegaScale, section 3.2):
    // a microbatch's compute. (ZeRO-3 gathers and reduce-scatters every microbatch, layer by
    // layer, FSDP's prefetch: the model charges one microbatch's 1.5 all-reduces, hidden
    // behind one microbatch's compute, the same share.) That microbatch's compute also hides
    // its share of the other axes' hidden traffic (taken as spread evenly over the
    // microbatches): DP hides behind what is left of it. Under DualPipe that first forward and
    // last backward run unpaired: the share is the unpaired stretch's, less what it hides
    double rest_hidden = rest[0] + rest[1] + rest[2] + rest[3];
    double dp_hidden = paired < 1 ? hidden(pr->dp_overlap, dp, ((1 - paired) * k.compute - rest_hidden) / ((1 - paired) * l->M)) : 0;
    k.dp = dp - dp_hidden;
    // hidden traffic is not free: its kernels take SMs from compute while they run (DeepSeek-
    // V3 gives 20 of an H800's 132 to its all-to-alls), and compute there runs on the rest
    if (pr->comm_sms > 0 && c->sms > 0) {
        k.overlap = (tp_hidden + cp_hidden + ep_hidden + pp_hidden + dp_hidden) * pr->comm_sms / c->sms;
        k.compute += k.overlap;
    }
    k.step = (k.compute + k.tp + k.cp + k.ep) / (1 - k.bubble) + k.pp + k.dp + k.optimizer;
    // memory: the device that holds the most, its stage's weights and activations
    for (int r = 0; r < l->pp; r++) {
        double dense, experts, acts = stage_activation_bytes(m, l, n, r, zbv_peak, pr->fp8);
        device_params(m, l, n, r, &dense, &experts);
        double weights = state_bytes_as(dense, l->zero, shards, pr->bf16_moments) + state_bytes_as(experts, l->zero, expert_shards, pr->bf16_moments);
        if (pr->grad_accum_pass) weights += 4 * (dense / (l->zero >= 2 ? shards : 1) + experts / (l->zero >= 2 ? expert_shards : 1));
        if (weights + acts > k.memory) k.memory = weights + acts, k.weights = weights, k.acts = acts;
    }
    k.fits = k.memory <= c->memory;
    k.mfu = m->tokens * model_flops(m) / (k.step * devices * c->flops);
    k.hfu = m->tokens * hardware_count_flops(m, l->recompute) / (k.step * devices * c->flops);
    k.gpu_hours_per_t = k.step * devices / 3600 * (1e12 / m->tokens);
    return k;
}

#endif // COSTMODEL_LLM_H
