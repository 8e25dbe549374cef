// llama_ops: lists the distinct ops (with result and source types) of the graphs libllama builds for a
// model: one 64-token prompt batch and one single-token decode, with exactly one backend library loaded.
//
//   llama_ops -l LIB -m MODEL [--fa on|off]
//
// The scheduler's eval callback sees every node before it is computed; answering "no" to its question
// keeps the graph in one piece, so this only observes.

#include "ggml-backend.h"
#include "ggml.h"
#include "llama.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SEEN 512
static char seen[MAX_SEEN][160];
static int n_seen;

static void describe(const struct ggml_tensor * t, char * buf, size_t n) {
    const char * name = ggml_op_desc(t);
    int k = snprintf(buf, n, "%-16s %-5s <-", name, ggml_type_name(t->type));
    for (int i = 0; i < GGML_MAX_SRC && t->src[i] && k < (int) n; i++) {
        k += snprintf(buf + k, n - k, " %s", ggml_type_name(t->src[i]->type));
    }
}

static bool on_node(struct ggml_tensor * t, bool ask, void * ud) {
    (void) ud;
    if (!ask) return true;
    char d[160];
    describe(t, d, sizeof d);
    for (int i = 0; i < n_seen; i++) {
        if (!strcmp(seen[i], d)) return false;
    }
    if (n_seen < MAX_SEEN) strcpy(seen[n_seen++], d);
    return false;
}

static void quiet(enum ggml_log_level level, const char * text, void * ud) {
    (void) ud;
    if (level >= GGML_LOG_LEVEL_WARN) fputs(text, stderr);
}

static int cmp(const void * a, const void * b) { return strcmp(a, b); }

int main(int argc, char ** argv) {
    const char * lib = NULL, * path = NULL;
    int fa = 1;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-l")) lib = argv[i + 1];
        else if (!strcmp(argv[i], "-m")) path = argv[i + 1];
        else if (!strcmp(argv[i], "--fa")) fa = !strcmp(argv[i + 1], "on");
    }
    if (!lib || !path) {
        fprintf(stderr, "usage: llama_ops -l LIB -m MODEL [--fa on|off]\n");
        return 2;
    }
    llama_log_set(quiet, NULL);
    ggml_log_set(quiet, NULL);
    if (!ggml_backend_load(lib)) { fprintf(stderr, "cannot load %s\n", lib); return 1; }
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model * model = llama_model_load_from_file(path, mp);
    if (!model) { fprintf(stderr, "cannot load %s\n", path); return 1; }
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 256;
    cp.n_batch = cp.n_ubatch = 64;
    cp.flash_attn_type = fa ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.cb_eval = on_node;
    cp.cb_eval_user_data = NULL;
    struct llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) { fprintf(stderr, "cannot create a context\n"); return 1; }

    llama_token toks[64];
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    for (int i = 0; i < 64; i++) toks[i] = (i * 7919 + 13) % n_vocab;
    if (llama_decode(ctx, llama_batch_get_one(toks, 64)) || llama_decode(ctx, llama_batch_get_one(toks, 1))) {
        fprintf(stderr, "decode failed\n");
        return 1;
    }
    qsort(seen, n_seen, sizeof seen[0], cmp);
    for (int i = 0; i < n_seen; i++) printf("%s\n", seen[i]);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
