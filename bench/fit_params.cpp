// llama.cpp's own automatic placement for a GPU budget: runs common_fit_params (common/fit.cpp
// of the pinned tree, library llama-common) for MODEL on the first GPU device, leaving it
// BUDGET_MIB of its free memory, and prints what it chose as llama_run options
// ("--ngl N -ot PATTERN=BUFT ..."), so that bench/gpu.sh step fit runs ggml's split with them.
//
//   fit_params MODEL BUDGET_MIB N_CTX LIB...   (LIB: the ggml backends to load, GPU first)
//
// Built on the GPU machine by bench/gpu.sh against a build of the pinned tree with
// LLAMA_BUILD_COMMON=ON; nothing of it is part of the library.
#include "fit.h"
#include "ggml-backend.h"
#include "llama.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

int main(int argc, char ** argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: fit_params MODEL BUDGET_MIB N_CTX LIB...\n");
        return 2;
    }
    const char * model = argv[1];
    const size_t budget = (size_t) atoll(argv[2]) << 20;
    const uint32_t n_ctx = (uint32_t) atoi(argv[3]);
    for (int i = 4; i < argc; i++) {
        if (!ggml_backend_load(argv[i])) {
            fprintf(stderr, "fit_params: cannot load %s\n", argv[i]);
            return 1;
        }
    }
    llama_backend_init();
    ggml_backend_dev_t gpu = nullptr;
    for (size_t i = 0; i < ggml_backend_dev_count() && !gpu; i++) {
        ggml_backend_dev_t d = ggml_backend_dev_get(i);
        if (ggml_backend_dev_type(d) == GGML_BACKEND_DEVICE_TYPE_GPU) gpu = d;
    }
    if (!gpu) {
        fprintf(stderr, "fit_params: no GPU device\n");
        return 1;
    }
    size_t free = 0, total = 0;
    ggml_backend_dev_memory(gpu, &free, &total);
    // The margin each device keeps free: all of the GPU's free memory but the budget.
    std::vector<size_t> margins(llama_max_devices(), 0);
    margins[0] = free > budget ? free - budget : 0;

    llama_model_params mp = llama_model_default_params();
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_batch = 512;
    cp.n_ubatch = 512;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    std::vector<float> split(llama_max_devices(), 0.0f);
    std::vector<llama_model_tensor_buft_override> ot(llama_max_tensor_buft_overrides(), {nullptr, nullptr});
    const common_params_fit_status st = common_fit_params(model, &mp, &cp, split.data(), ot.data(), margins.data(),
                                                          n_ctx, nullptr, GGML_LOG_LEVEL_INFO);
    if (st != COMMON_PARAMS_FIT_STATUS_SUCCESS) {
        fprintf(stderr, "fit_params: common_fit_params status %d\n", (int) st);
        return 1;
    }
    fprintf(stderr, "fit_params: %s, %zu MiB free, budget %zu MiB: n_gpu_layers %d\n", ggml_backend_dev_name(gpu),
            free >> 20, budget >> 20, mp.n_gpu_layers);
    std::string args = "--ngl " + std::to_string(mp.n_gpu_layers);
    for (const auto & o : ot) {
        if (!o.pattern) break;
        args += std::string(" -ot ") + o.pattern + "=" + ggml_backend_buft_name(o.buft);
    }
    printf("%s\n", args.c_str());
    return 0;
}
