// llama_run: runs a GGUF model through libllama with exactly ONE ggml backend library loaded
// (rocmforge, or ggml's own CPU backend for reference), the way an unmodified llama.cpp host
// would after ggml_backend_load().
//
//   llama_run generate -b rocmforge|ggml-cpu -l LIB -m MODEL [-p PROMPT] [-n N] [-t THREADS] [--fa on|off]
//       prompt in, text out, prompt and generation tokens/s printed; on stderr, the seconds from
//       ggml_backend_load to the first token (sampled after the prompt) and to the second (after
//       the first one-token graph): what a first start costs (kernels compiled or read from a cache)
//   llama_run logits   -b ... -l LIB -m MODEL -o FILE [-t THREADS] [--fa on|off] [--positions N] [--gen N]
//       teacher-forced logits of N positions of a fixed text, then greedy continuation ids (binary file);
//       LLAMA_RUN_GEN_LOGITS=FILE also writes each greedy step's logits there
//   llama_run embed    -b ... -l LIB -m MODEL -o FILE [-t THREADS] [--fa on|off] [--positions N]
//       an embedding model's pooled embeddings (llama_get_embeddings_seq) of 8 sequences of N/8 tokens of
//       the same text, decoded in one batch; written in the logits file's format (8 rows of n_embd, no ids)
//   llama_run bench    -b ... -l LIB -m MODEL [-t THREADS] [--pp N] [--tg N] [--reps R] [--depth N]
//       pp<N> and tg<N> tokens/s (best of R repetitions, then every repetition); --depth N: both after
//       N tokens of context; --ctx defaults: libllama's default context parameters (n_ctx 512, n_batch
//       2048, n_ubatch 512, flash attention auto) instead of n_ctx = pp + tg, n_batch = n_ubatch = pp
//
// -ot PATTERN=BUFT and --cpu-moe: llama.cpp's tensor overrides (experts on the CPU device).
// Common options: --device NAME puts every layer and the KV cache on that device (e.g. RFGPU0
// or CUDA0: devices = {NAME}, n_gpu_layers = -1, offload_kqv; NAME,NAME2 splits the layers
// (PREFIX* names every device whose name starts so, e.g. RFGPU*; exit 3 where there is none)
// between devices; --ngl N puts only N layers there, as llama.cpp's -ngl; --sm layer|row|tensor|none is
// llama.cpp's -sm: row spreads each weight matrix's rows over every GPU through the library's
// split buffer type; --ts A,B,... its -ts, the share of each device, as llama.cpp's tensor_split); without it all runs on the
// library's CPU device. --mmap off reads the file instead of mapping it (libllama then uploads
// GPU weights through the device's pinned host buffers and events, where it has them). -L LIB2 loads a second backend library, for hosts whose GPU library
// has no CPU device of its own (ggml-cuda needs ggml-cpu beside it). --rpc HOST:PORT adds the devices
// of a ggml RPC server (rocmforge-rpc-server; needs -L libggml-rpc.so) and, without --device, puts
// every layer on them, as llama.cpp's --rpc does.

#include "ggml-backend.h"
#include "ggml.h"
#include "llama.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

// Closes an output file; 0 (and a line saying why) when any write to it failed, e.g. a full disk,
// so a short file never leaves with exit status 0.
static int close_output(FILE * f, const char * path) {
    int bad = ferror(f);
    if (fclose(f) != 0 || bad) {
        fprintf(stderr, "llama_run: writing %s failed: %s\n", path, strerror(errno ? errno : EIO));
        return 0;
    }
    return 1;
}

static const char * DEFAULT_PROMPT = "The three primary colors are";
// Teacher-forced text: long enough for 64+ tokens with SmolLM2's tokenizer.
static const char * FORCED_TEXT =
    "The history of computing is a story of people building tools to think faster. Early mechanical "
    "calculators gave way to electronic machines filling entire rooms, and those in turn shrank into the "
    "chips that now sit in every phone. Along the way programmers invented languages, operating systems "
    "and networks, and each step changed what ordinary people could do with a machine on their desk.";

// Greedy continuation prompt of the logits mode: a strongly determined continuation, so the test of
// identical tokens is not decided by a near-tie between two candidates.
static const char * GREEDY_PROMPT = "Counting in words: one, two, three, four,";

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

struct opts {
    const char * mode, * backend, * lib, * lib2, * device, * model, * prompt, * out, * rpc;
    // KV cache type (--kv f16|q8_0|q4_0): K always, V only with flash attention (llama.cpp
    // quantizes V only then).
    enum ggml_type kv;
    int n_predict, threads, fa, positions, gen, pp, tg, reps, no_mmap, depth;
    // --ngl N with --device: only the last N layers on the device, the rest on the CPU device
    // (llama.cpp's -ngl); -1 (default): every layer.
    int ngl;
    // --sm layer|row|tensor|none (llama.cpp's -sm; default layer) and --ts A,B,... (its -ts).
    enum llama_split_mode sm;
    const char * ts;
    // --ctx defaults: libllama's default context parameters (n_ctx, n_batch, n_ubatch, flash
    // attention auto, F16 caches) with only the threads set, as a plain host gets them.
    int ctx_defaults;
    // -ot PATTERN=BUFT (repeatable; llama.cpp's --override-tensor): tensors whose names match
    // the regular expression go to the named buffer type ("CPU": the CPU device's), e.g.
    // "\\.ffn_(up|down|gate)_exps=CPU", which is what --cpu-moe sets.
    const char * ot[64];
    int n_ot;
};

static void usage(void) {
    fprintf(stderr, "usage: llama_run generate|logits|embed|bench -b rocmforge|ggml-cpu -l LIB [-L LIB2] -m MODEL [--device NAME] [--rpc HOST:PORT] [options]\n");
    exit(2);
}

static struct opts parse(int argc, char ** argv) {
    struct opts o = {0};
    if (argc < 2) usage();
    o.mode = argv[1];
    o.backend = "rocmforge";
    o.prompt = DEFAULT_PROMPT;
    o.kv = GGML_TYPE_F16;
    o.sm = LLAMA_SPLIT_MODE_LAYER;
    o.ngl = -1; o.n_predict = 32; o.threads = 2; o.fa = 1; o.positions = 64; o.gen = 16; o.pp = 512; o.tg = 128; o.reps = 2;
    for (int i = 2; i < argc; i++) {
        const char * a = argv[i];
        if (!strcmp(a, "--cpu-moe")) {
            if (o.n_ot < 64) o.ot[o.n_ot++] = "\\.ffn_(up|down|gate)_exps=CPU";
            continue;
        }
        const char * v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) usage();
        if      (!strcmp(a, "-b")) o.backend = v;
        else if (!strcmp(a, "-l")) o.lib = v;
        else if (!strcmp(a, "-L")) o.lib2 = v;
        else if (!strcmp(a, "--device")) o.device = v;
        else if (!strcmp(a, "--rpc")) o.rpc = v;
        else if (!strcmp(a, "-m")) o.model = v;
        else if (!strcmp(a, "-p")) o.prompt = v;
        else if (!strcmp(a, "-o")) o.out = v;
        else if (!strcmp(a, "-n")) o.n_predict = atoi(v);
        else if (!strcmp(a, "-t")) o.threads = atoi(v);
        else if (!strcmp(a, "--fa")) o.fa = !strcmp(v, "on");
        else if (!strcmp(a, "--kv")) o.kv = !strcmp(v, "q8_0") ? GGML_TYPE_Q8_0 : !strcmp(v, "q4_0") ? GGML_TYPE_Q4_0 : GGML_TYPE_F16;
        else if (!strcmp(a, "--mmap")) o.no_mmap = !strcmp(v, "off");
        else if (!strcmp(a, "--positions")) o.positions = atoi(v);
        else if (!strcmp(a, "--gen")) o.gen = atoi(v);
        else if (!strcmp(a, "--pp")) o.pp = atoi(v);
        else if (!strcmp(a, "--tg")) o.tg = atoi(v);
        else if (!strcmp(a, "--reps")) o.reps = atoi(v);
        else if (!strcmp(a, "--depth")) o.depth = atoi(v);
        else if (!strcmp(a, "--ngl")) o.ngl = atoi(v);
        else if (!strcmp(a, "--sm")) o.sm = !strcmp(v, "row") ? LLAMA_SPLIT_MODE_ROW : !strcmp(v, "none") ? LLAMA_SPLIT_MODE_NONE
                                          : !strcmp(v, "tensor") ? LLAMA_SPLIT_MODE_TENSOR : LLAMA_SPLIT_MODE_LAYER;
        else if (!strcmp(a, "--ts")) o.ts = v;
        else if (!strcmp(a, "--ctx")) o.ctx_defaults = !strcmp(v, "defaults");
        else if (!strcmp(a, "-ot") && o.n_ot < 64) o.ot[o.n_ot++] = v;
        else usage();
        i++;
    }
    if (!o.lib || !o.model) usage();
    return o;
}

static int quiet_log = 1;
static void log_cb(enum ggml_log_level level, const char * text, void * ud) {
    (void) ud;
    if (!quiet_log || level >= GGML_LOG_LEVEL_WARN || strstr(text, "rocmforge")) fputs(text, stderr);
}

// LLAMA_RUN_DUMP=DIR: every F32 node computed is written to DIR/<seq>_<name>.bin, to find the first
// node where two backends part ways.
static int dump_seq = 0;
static bool dump_cb(struct ggml_tensor * t, bool ask, void * ud) {
    const char * dir = (const char *) ud;
    if (ask) return t->type == GGML_TYPE_F32;
    if (t->type != GGML_TYPE_F32 || !ggml_is_contiguous(t)) return true;
    size_t n = ggml_nbytes(t);
    float * buf = malloc(n);
    ggml_backend_tensor_get(t, buf, 0, n);
    char path[1024];
    snprintf(path, sizeof path, "%s/%05d_%s_%s.bin", dir, dump_seq++, ggml_op_desc(t), t->name);
    for (char * c = path + strlen(dir) + 1; *c; c++) if (*c == ' ' || *c == '/') *c = '_';
    FILE * f = fopen(path, "wb");
    if (f) { fwrite(buf, 1, n, f); fclose(f); }
    free(buf);
    return true;
}

static struct llama_context * make_ctx(struct llama_model * model, const struct opts * o, int n_ctx, int n_batch) {
    struct llama_context_params cp = llama_context_default_params();
    cp.n_threads = o->threads;
    cp.n_threads_batch = o->threads;
    cp.no_perf = true;
    if (o->ctx_defaults) return llama_init_from_model(model, cp);
    cp.n_ctx = n_ctx;
    cp.n_batch = n_batch;
    cp.n_ubatch = n_batch;
    cp.flash_attn_type = o->fa ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.type_k = o->kv;
    cp.type_v = o->fa ? o->kv : GGML_TYPE_F16;
    cp.offload_kqv = o->device != NULL;
    if (!strcmp(o->mode, "embed")) {
        cp.embeddings = true;
        cp.n_seq_max = 8;
    }
    if (getenv("LLAMA_RUN_DUMP")) {
        cp.cb_eval = dump_cb;
        cp.cb_eval_user_data = getenv("LLAMA_RUN_DUMP");
    }
    return llama_init_from_model(model, cp);
}

// Decodes `depth` tokens of toks (in batches of at most `batch`) into an empty cache: the context
// that bench's pp and tg run after. 1 when a decode fails.
static int fill_depth(struct llama_context * ctx, const llama_token * toks, int depth, int batch) {
    for (int done = 0; done < depth;) {
        const int n = depth - done < batch ? depth - done : batch;
        if (llama_decode(ctx, llama_batch_get_one((llama_token *) toks, n))) { fprintf(stderr, "decode failed\n"); return 1; }
        done += n;
    }
    llama_synchronize(ctx);  // the last batch may still run on an asynchronous backend: not timed
    return 0;
}

static int argmax(const float * v, int n) {
    int best = 0;
    for (int i = 1; i < n; i++) if (v[i] > v[best]) best = i;
    return best;
}

int main(int argc, char ** argv) {
    struct opts o = parse(argc, argv);
    if (getenv("LLAMA_RUN_VERBOSE")) quiet_log = 0;
    llama_log_set(log_cb, NULL);
    ggml_log_set(log_cb, NULL);

    // Exactly the named backend libraries: no ggml_backend_load_all(), so nothing else is registered.
    const double t_start = now_s();
    ggml_backend_reg_t reg = ggml_backend_load(o.lib);
    if (!reg) { fprintf(stderr, "llama_run: cannot load %s\n", o.lib); return 1; }
    if (o.lib2 && !ggml_backend_load(o.lib2)) { fprintf(stderr, "llama_run: cannot load %s\n", o.lib2); return 1; }
    if (ggml_backend_reg_count() != (o.lib2 ? 2u : 1u)) { fprintf(stderr, "llama_run: unexpected backend registries\n"); return 1; }
    fprintf(stderr, "llama_run: backend registry '%s', %zu device(s), first: %s\n", ggml_backend_reg_name(reg),
            ggml_backend_reg_dev_count(reg), ggml_backend_dev_name(ggml_backend_reg_dev_get(reg, 0)));
    llama_backend_init();

    // --rpc: the server's devices through the RPC registry's add_server (as llama.cpp's --rpc), every
    // layer on them unless --device names others.
    char rpc_devs[256] = "";
    if (o.rpc) {
        ggml_backend_reg_t rpc = ggml_backend_reg_by_name("RPC");
        typedef ggml_backend_reg_t (*add_server_fn)(const char * endpoint);
        add_server_fn add = rpc ? (add_server_fn) ggml_backend_reg_get_proc_address(rpc, "ggml_backend_rpc_add_server") : NULL;
        if (!add) { fprintf(stderr, "llama_run: --rpc needs ggml's RPC backend (-L libggml-rpc.so)\n"); return 1; }
        ggml_backend_reg_t server = add(o.rpc);
        if (!server) { fprintf(stderr, "llama_run: RPC server %s has no devices\n", o.rpc); return 1; }
        ggml_backend_register(server);
        for (size_t i = 0; i < ggml_backend_reg_dev_count(server); i++)
            snprintf(rpc_devs + strlen(rpc_devs), sizeof rpc_devs - strlen(rpc_devs), "%s%s", i ? "," : "",
                     ggml_backend_dev_name(ggml_backend_reg_dev_get(server, i)));
        if (!o.device) o.device = rpc_devs;
    }

    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    if (o.no_mmap) mp.load_mode = LLAMA_LOAD_MODE_NONE;
    // --device A[,B...]: every layer on these devices (libllama splits the layers between them
    // in proportion to their free memory; activations cross between them).
    ggml_backend_dev_t devs[9] = { NULL };
    if (o.device) {
        char names[256];
        snprintf(names, sizeof names, "%s", o.device);
        // PREFIX*: every device whose name starts so (RFGPU*: all GPUs); none: exit 3.
        size_t plen = strlen(names);
        if (plen > 0 && names[plen - 1] == '*') {
            names[plen - 1] = 0;
            char all[256] = "";
            for (size_t d = 0; d < ggml_backend_dev_count(); d++) {
                const char * dn = ggml_backend_dev_name(ggml_backend_dev_get(d));
                if (!strncmp(dn, names, plen - 1) && strlen(all) + strlen(dn) + 2 < sizeof all)
                    snprintf(all + strlen(all), sizeof all - strlen(all), "%s%s", all[0] ? "," : "", dn);
            }
            if (!all[0]) { printf("skipped: no GPU (no device named %s*)\n", names); return 3; }
            snprintf(names, sizeof names, "%s", all);
        }
        int n = 0;
        for (char * tok = strtok(names, ","); tok && n < 8; tok = strtok(NULL, ",")) {
            devs[n] = ggml_backend_dev_by_name(tok);
            if (!devs[n]) { fprintf(stderr, "llama_run: no device named %s\n", tok); return 1; }
            fprintf(stderr, "llama_run: offloading to %s (%s)\n", tok, ggml_backend_dev_description(devs[n]));
            n++;
        }
        mp.devices = devs;
        mp.n_gpu_layers = o.ngl;
    }
    mp.split_mode = o.sm;
    // --ts: one share per device (the rest 0), as llama.cpp's -ts.
    static float ts[128];
    if (o.ts) {
        char list[256];
        snprintf(list, sizeof list, "%s", o.ts);
        int n = 0;
        for (char * tok = strtok(list, ","); tok && n < 128 && (size_t) n < llama_max_devices(); tok = strtok(NULL, ","))
            ts[n++] = (float) atof(tok);
        mp.tensor_split = ts;
    }
    if (o.sm != LLAMA_SPLIT_MODE_LAYER || o.ts)
        fprintf(stderr, "llama_run: split mode %s%s%s\n", o.sm == LLAMA_SPLIT_MODE_ROW ? "row" : o.sm == LLAMA_SPLIT_MODE_NONE ? "none" : o.sm == LLAMA_SPLIT_MODE_TENSOR ? "tensor" : "layer",
                o.ts ? ", tensor split " : "", o.ts ? o.ts : "");
    // -ot / --cpu-moe: a buffer type by name, "CPU" being the CPU device's.
    struct llama_model_tensor_buft_override ots[65];
    static char ot_pat[64][256];
    for (int i = 0; i < o.n_ot; i++) {
        const char * eq = strrchr(o.ot[i], '=');
        if (!eq || eq == o.ot[i] || (size_t) (eq - o.ot[i]) >= sizeof ot_pat[i]) { fprintf(stderr, "llama_run: -ot %s: want PATTERN=BUFT\n", o.ot[i]); return 1; }
        snprintf(ot_pat[i], sizeof ot_pat[i], "%.*s", (int) (eq - o.ot[i]), o.ot[i]);
        ggml_backend_buffer_type_t bt = NULL;
        if (!strcmp(eq + 1, "CPU")) {
            ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
            bt = cpu ? ggml_backend_dev_buffer_type(cpu) : NULL;
        } else {
            for (size_t d = 0; d < ggml_backend_dev_count() && !bt; d++) {
                ggml_backend_buffer_type_t b = ggml_backend_dev_buffer_type(ggml_backend_dev_get(d));
                if (!strcmp(ggml_backend_buft_name(b), eq + 1)) bt = b;
            }
        }
        if (!bt) { fprintf(stderr, "llama_run: -ot: no buffer type %s\n", eq + 1); return 1; }
        fprintf(stderr, "llama_run: tensors matching %s go to %s\n", ot_pat[i], ggml_backend_buft_name(bt));
        ots[i] = (struct llama_model_tensor_buft_override) { ot_pat[i], bt };
    }
    ots[o.n_ot] = (struct llama_model_tensor_buft_override) { NULL, NULL };
    if (o.n_ot) mp.tensor_buft_overrides = ots;
    struct llama_model * model = llama_model_load_from_file(o.model, mp);
    if (!model) { fprintf(stderr, "llama_run: cannot load model %s\n", o.model); return 1; }
    const struct llama_vocab * vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);

    int rc = 0;
    if (!strcmp(o.mode, "generate")) {
        llama_token toks[512];
        int n_prompt = llama_tokenize(vocab, o.prompt, (int) strlen(o.prompt), toks, 512, true, true);
        if (n_prompt <= 0) { fprintf(stderr, "llama_run: tokenize failed\n"); return 1; }
        struct llama_context * ctx = make_ctx(model, &o, n_prompt + o.n_predict + 8, 512);
        struct llama_sampler * smpl = llama_sampler_init_greedy();
        printf("%s", o.prompt);
        fflush(stdout);
        double t0 = now_s();
        if (llama_decode(ctx, llama_batch_get_one(toks, n_prompt))) { fprintf(stderr, "decode failed\n"); return 1; }
        llama_synchronize(ctx);  // an asynchronous backend may still be computing
        double t1 = now_s();
        int n_gen = 0;
        llama_token tok = llama_sampler_sample(smpl, ctx, -1);
        const double t_first = now_s();
        double t_second = 0;
        while (n_gen < o.n_predict && !llama_vocab_is_eog(vocab, tok)) {
            char piece[256];
            int n = llama_token_to_piece(vocab, tok, piece, sizeof piece, 0, true);
            if (n > 0) { fwrite(piece, 1, n, stdout); fflush(stdout); }
            n_gen++;
            if (llama_decode(ctx, llama_batch_get_one(&tok, 1))) { fprintf(stderr, "decode failed\n"); return 1; }
            tok = llama_sampler_sample(smpl, ctx, -1);
            if (n_gen == 1) t_second = now_s();
        }
        fprintf(stderr, "llama_run: first token %.3f s after ggml_backend_load (prompt %.3f s), second %.3f s\n",
                t_first - t_start, t1 - t0, t_second > 0 ? t_second - t_start : 0.0);
        double t2 = now_s();
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        printf("\n\n[%s, %d threads] prompt: %d tokens, %.1f tokens/s | generation: %d tokens, %.1f tokens/s | peak RSS %ld KiB\n",
               o.backend, o.threads, n_prompt, n_prompt / (t1 - t0), n_gen, n_gen / (t2 - t1), (long) ru.ru_maxrss);
        llama_sampler_free(smpl);
        llama_free(ctx);
    } else if (!strcmp(o.mode, "logits")) {
        if (!o.out) usage();
        llama_token toks[1024];
        int n_tok = llama_tokenize(vocab, FORCED_TEXT, (int) strlen(FORCED_TEXT), toks, 1024, true, true);
        if (n_tok < o.positions) { fprintf(stderr, "llama_run: text has only %d tokens\n", n_tok); return 1; }
        struct llama_context * ctx = make_ctx(model, &o, o.positions + o.gen + 8, o.positions);
        struct llama_batch batch = llama_batch_init(o.positions, 0, 1);
        for (int i = 0; i < o.positions; i++) {
            batch.token[i] = toks[i]; batch.pos[i] = i; batch.n_seq_id[i] = 1; batch.seq_id[i][0] = 0; batch.logits[i] = 1;
        }
        batch.n_tokens = o.positions;
        if (llama_decode(ctx, batch)) { fprintf(stderr, "decode failed\n"); return 1; }
        FILE * f = fopen(o.out, "wb");
        if (!f) { perror(o.out); return 1; }
        int32_t hdr[3] = { o.positions, n_vocab, o.gen };
        fwrite(hdr, sizeof hdr, 1, f);
        for (int i = 0; i < o.positions; i++) fwrite(llama_get_logits_ith(ctx, i), sizeof(float), n_vocab, f);
        // Greedy continuation of a fixed prompt, in a fresh context.
        llama_memory_clear(llama_get_memory(ctx), true);
        llama_token gp[128];
        int n_gp = llama_tokenize(vocab, GREEDY_PROMPT, (int) strlen(GREEDY_PROMPT), gp, 128, true, true);
        if (n_gp <= 0 || llama_decode(ctx, llama_batch_get_one(gp, n_gp))) { fprintf(stderr, "decode failed\n"); return 1; }
        int32_t tok = argmax(llama_get_logits_ith(ctx, -1), n_vocab);
        // LLAMA_RUN_GEN_LOGITS=FILE: every greedy step's logits too (one-token graphs' results).
        FILE * fg = getenv("LLAMA_RUN_GEN_LOGITS") ? fopen(getenv("LLAMA_RUN_GEN_LOGITS"), "wb") : NULL;
        for (int g = 0; g < o.gen; g++) {
            fwrite(&tok, sizeof tok, 1, f);
            if (llama_decode(ctx, llama_batch_get_one(&tok, 1))) { fprintf(stderr, "decode failed\n"); return 1; }
            tok = argmax(llama_get_logits_ith(ctx, -1), n_vocab);
            if (fg) fwrite(llama_get_logits_ith(ctx, -1), sizeof(float), n_vocab, fg);
        }
        if (fg && !close_output(fg, getenv("LLAMA_RUN_GEN_LOGITS"))) return 1;
        if (!close_output(f, o.out)) return 1;
        llama_batch_free(batch);
        llama_free(ctx);
    } else if (!strcmp(o.mode, "embed")) {
        // 8 sequences in one batch: the non-causal mask keeps them apart and pooling sums each one's rows.
        if (!o.out) usage();
        const int n_seq = 8, per = o.positions / 8;
        llama_token toks[1024];
        int n_tok = llama_tokenize(vocab, FORCED_TEXT, (int) strlen(FORCED_TEXT), toks, 1024, true, true);
        if (per < 1 || n_tok < n_seq * per) { fprintf(stderr, "llama_run: text has only %d tokens\n", n_tok); return 1; }
        struct llama_context * ctx = make_ctx(model, &o, n_seq * per, n_seq * per);
        if (!ctx) { fprintf(stderr, "llama_run: cannot create the context\n"); return 1; }
        const int n_embd = llama_model_n_embd(model);
        struct llama_batch batch = llama_batch_init(n_seq * per, 0, 1);
        for (int i = 0; i < n_seq * per; i++) {
            batch.token[i] = toks[i]; batch.pos[i] = i % per; batch.n_seq_id[i] = 1; batch.seq_id[i][0] = i / per;
            batch.logits[i] = 1;
        }
        batch.n_tokens = n_seq * per;
        if (llama_decode(ctx, batch)) { fprintf(stderr, "decode failed\n"); return 1; }
        FILE * f = fopen(o.out, "wb");
        if (!f) { perror(o.out); return 1; }
        int32_t hdr[3] = { n_seq, n_embd, 0 };
        fwrite(hdr, sizeof hdr, 1, f);
        for (int s = 0; s < n_seq; s++) {
            const float * e = llama_get_embeddings_seq(ctx, s);
            if (!e) { fprintf(stderr, "llama_run: no pooled embeddings (is it an embedding model?)\n"); return 1; }
            fwrite(e, sizeof(float), n_embd, f);
        }
        if (!close_output(f, o.out)) return 1;
        llama_batch_free(batch);
        llama_free(ctx);
    } else if (!strcmp(o.mode, "bench")) {
        llama_token * toks = malloc(sizeof(llama_token) * o.pp);
        for (int i = 0; i < o.pp; i++) toks[i] = (llama_token) ((i * 7919 + 13) % n_vocab);
        double best_pp = 0, best_tg = 0;
        char reps_pp[256] = "", reps_tg[256] = "";  // every repetition, "a/b/c"
        struct llama_context * ctx = make_ctx(model, &o, o.depth + (o.pp > o.tg ? o.pp : o.tg) + 16, o.pp);
        for (int r = 0; r < o.reps; r++) {
            // pp and tg after --depth N tokens of context (llama-bench -d), decoded in batches
            // of pp first; 0: after an empty cache.
            llama_memory_clear(llama_get_memory(ctx), true);
            if (fill_depth(ctx, toks, o.depth, o.pp)) return 1;
            double t0 = now_s();
            if (llama_decode(ctx, llama_batch_get_one(toks, o.pp))) { fprintf(stderr, "decode failed\n"); return 1; }
            llama_synchronize(ctx);  // as llama-bench: asynchronous backends return before the GPU is done
            double t1 = now_s();
            if (o.pp / (t1 - t0) > best_pp) best_pp = o.pp / (t1 - t0);
            snprintf(reps_pp + strlen(reps_pp), sizeof reps_pp - strlen(reps_pp), "%s%.0f", r ? "/" : "", o.pp / (t1 - t0));
            // tg: generation after a 1-token prompt (as llama-bench measures it) or the depth.
            llama_memory_clear(llama_get_memory(ctx), true);
            if (fill_depth(ctx, toks, o.depth, o.pp)) return 1;
            llama_token tok = toks[0];
            double t2 = now_s();
            for (int i = 0; i < o.tg; i++) {
                if (llama_decode(ctx, llama_batch_get_one(&tok, 1))) { fprintf(stderr, "decode failed\n"); return 1; }
                tok = argmax(llama_get_logits_ith(ctx, -1), n_vocab);
            }
            double t3 = now_s();
            if (o.tg / (t3 - t2) > best_tg) best_tg = o.tg / (t3 - t2);
            snprintf(reps_tg + strlen(reps_tg), sizeof reps_tg - strlen(reps_tg), "%s%.1f", r ? "/" : "", o.tg / (t3 - t2));
        }
        char at[24] = "";  // "@d2048" after a context
        if (o.depth) snprintf(at, sizeof at, "@d%d", o.depth);
        printf("backend=%s device=%s threads=%d pp%d%s=%.2f tg%d%s=%.2f reps_pp=%s reps_tg=%s\n", o.backend,
               o.device ? o.device : "cpu", o.threads, o.pp, at, best_pp, o.tg, at, best_tg, reps_pp, reps_tg);
        free(toks);
        llama_free(ctx);
    } else {
        usage();
    }
    llama_model_free(model);
    return rc;
}
