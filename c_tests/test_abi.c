// test_abi: rocmforge's Rust mirrors of ggml's structs must have exactly the layout of the real
// ggml 0.26.0 headers. The library reports its sizes/offsets through
// ggml_backend_rocmforge_abi_layout(); this file computes the same table from ggml's own
// (internal) headers with sizeof/offsetof and compares every row, in both directions.
#include "common.h"

#include <stddef.h>
#include <string.h>

#include "ggml-backend-impl.h"
#include "ggml-impl.h"
#include "ggml-rocmforge.h"

#include <dlfcn.h>

struct row {
    const char * what;
    const char * field;  // "" = sizeof
    size_t value;
    bool seen;
};

#define SIZE(S) { #S, "", sizeof(struct S), false }
#define OFF(S, F) { #S, #F, offsetof(struct S, F), false }

static struct row c_rows[] = {
    SIZE(ggml_tensor),
    OFF(ggml_tensor, type), OFF(ggml_tensor, buffer), OFF(ggml_tensor, ne), OFF(ggml_tensor, nb),
    OFF(ggml_tensor, op), OFF(ggml_tensor, op_params), OFF(ggml_tensor, flags), OFF(ggml_tensor, src),
    OFF(ggml_tensor, view_src), OFF(ggml_tensor, view_offs), OFF(ggml_tensor, data), OFF(ggml_tensor, name),
    OFF(ggml_tensor, extra),

    SIZE(ggml_hash_set),
    OFF(ggml_hash_set, size), OFF(ggml_hash_set, used), OFF(ggml_hash_set, keys),

    SIZE(ggml_cgraph),
    OFF(ggml_cgraph, size), OFF(ggml_cgraph, n_nodes), OFF(ggml_cgraph, n_leafs), OFF(ggml_cgraph, nodes),
    OFF(ggml_cgraph, grads), OFF(ggml_cgraph, grad_accs), OFF(ggml_cgraph, leafs), OFF(ggml_cgraph, use_counts),
    OFF(ggml_cgraph, visited_hash_set), OFF(ggml_cgraph, order), OFF(ggml_cgraph, uid),

    SIZE(ggml_backend_buffer_type_i),
    OFF(ggml_backend_buffer_type_i, get_name), OFF(ggml_backend_buffer_type_i, alloc_buffer),
    OFF(ggml_backend_buffer_type_i, alloc_buffer_n), OFF(ggml_backend_buffer_type_i, get_alignment),
    OFF(ggml_backend_buffer_type_i, get_max_size), OFF(ggml_backend_buffer_type_i, get_alloc_size),
    OFF(ggml_backend_buffer_type_i, get_alloc_size_n), OFF(ggml_backend_buffer_type_i, is_host),

    SIZE(ggml_backend_buffer_type),
    OFF(ggml_backend_buffer_type, iface), OFF(ggml_backend_buffer_type, device), OFF(ggml_backend_buffer_type, context),

    SIZE(ggml_backend_buffer_i),
    OFF(ggml_backend_buffer_i, free_buffer), OFF(ggml_backend_buffer_i, get_base), OFF(ggml_backend_buffer_i, init_tensor),
    OFF(ggml_backend_buffer_i, memset_tensor), OFF(ggml_backend_buffer_i, set_tensor), OFF(ggml_backend_buffer_i, get_tensor),
    OFF(ggml_backend_buffer_i, set_tensor_2d), OFF(ggml_backend_buffer_i, get_tensor_2d), OFF(ggml_backend_buffer_i, cpy_tensor),
    OFF(ggml_backend_buffer_i, clear), OFF(ggml_backend_buffer_i, reset),

    SIZE(ggml_backend_buffer),
    OFF(ggml_backend_buffer, iface), OFF(ggml_backend_buffer, buft), OFF(ggml_backend_buffer, context),
    OFF(ggml_backend_buffer, size), OFF(ggml_backend_buffer, usage),

    SIZE(ggml_backend_graph_optimize_params),
    OFF(ggml_backend_graph_optimize_params, add_alloc_dep), OFF(ggml_backend_graph_optimize_params, user_data),

    SIZE(ggml_backend_i),
    OFF(ggml_backend_i, get_name), OFF(ggml_backend_i, free), OFF(ggml_backend_i, set_tensor_async),
    OFF(ggml_backend_i, get_tensor_async), OFF(ggml_backend_i, set_tensor_2d_async), OFF(ggml_backend_i, get_tensor_2d_async),
    OFF(ggml_backend_i, cpy_tensor_async), OFF(ggml_backend_i, synchronize), OFF(ggml_backend_i, graph_plan_create),
    OFF(ggml_backend_i, graph_plan_free), OFF(ggml_backend_i, graph_plan_update), OFF(ggml_backend_i, graph_plan_compute),
    OFF(ggml_backend_i, graph_compute), OFF(ggml_backend_i, event_record), OFF(ggml_backend_i, event_wait),
    OFF(ggml_backend_i, graph_optimize),

    SIZE(ggml_backend),
    OFF(ggml_backend, guid), OFF(ggml_backend, iface), OFF(ggml_backend, device), OFF(ggml_backend, context),

    SIZE(ggml_backend_event),
    OFF(ggml_backend_event, device), OFF(ggml_backend_event, context),

    SIZE(ggml_backend_dev_caps),
    OFF(ggml_backend_dev_caps, async), OFF(ggml_backend_dev_caps, host_buffer),
    OFF(ggml_backend_dev_caps, buffer_from_host_ptr), OFF(ggml_backend_dev_caps, events),
    OFF(ggml_backend_dev_caps, mmap_support),

    SIZE(ggml_backend_dev_props),
    OFF(ggml_backend_dev_props, name), OFF(ggml_backend_dev_props, description), OFF(ggml_backend_dev_props, memory_free),
    OFF(ggml_backend_dev_props, memory_total), OFF(ggml_backend_dev_props, type), OFF(ggml_backend_dev_props, device_id),
    OFF(ggml_backend_dev_props, caps),

    SIZE(ggml_backend_device_i),
    OFF(ggml_backend_device_i, get_name), OFF(ggml_backend_device_i, get_description), OFF(ggml_backend_device_i, get_memory),
    OFF(ggml_backend_device_i, get_type), OFF(ggml_backend_device_i, get_props), OFF(ggml_backend_device_i, init_backend),
    OFF(ggml_backend_device_i, get_buffer_type), OFF(ggml_backend_device_i, get_host_buffer_type),
    OFF(ggml_backend_device_i, buffer_from_host_ptr), OFF(ggml_backend_device_i, supports_op),
    OFF(ggml_backend_device_i, supports_buft), OFF(ggml_backend_device_i, offload_op), OFF(ggml_backend_device_i, event_new),
    OFF(ggml_backend_device_i, event_free), OFF(ggml_backend_device_i, event_synchronize),

    SIZE(ggml_backend_device),
    OFF(ggml_backend_device, iface), OFF(ggml_backend_device, reg), OFF(ggml_backend_device, context),

    SIZE(ggml_backend_reg_i),
    OFF(ggml_backend_reg_i, get_name), OFF(ggml_backend_reg_i, get_device_count), OFF(ggml_backend_reg_i, get_device),
    OFF(ggml_backend_reg_i, get_proc_address),

    SIZE(ggml_backend_reg),
    OFF(ggml_backend_reg, api_version), OFF(ggml_backend_reg, iface), OFF(ggml_backend_reg, context),

    SIZE(ggml_backend_feature),
    OFF(ggml_backend_feature, name), OFF(ggml_backend_feature, value),
};

// Rust cannot name a field `type` or `async`; its mirrors use `type_` and `async_`.
static void c_field_name(const char * rust, char * out, size_t n) {
    snprintf(out, n, "%s", rust);
    size_t len = strlen(out);
    if (len > 1 && out[len - 1] == '_') {
        out[len - 1] = '\0';
    }
}

typedef bool (*abi_layout_fn)(size_t, const char **, const char **, size_t *);

int main(void) {
    // Loaded like a host would (ggml_backend_load); the test hook is then looked up in the same
    // library with dlsym, without linking it.
    ggml_backend_reg_t reg = rf_rocmforge_reg();
    CHECK(reg != NULL, "registry");
    CHECK(ggml_backend_reg_name(reg) && strcmp(ggml_backend_reg_name(reg), "rocmforge") == 0, "registry name");
    CHECK(reg->api_version == GGML_BACKEND_API_VERSION, "api_version %d, expected %d", reg->api_version,
          GGML_BACKEND_API_VERSION);

    void * lib = dlopen(ROCMFORGE_LIB_PATH, RTLD_NOW | RTLD_NOLOAD);
    abi_layout_fn layout = lib ? (abi_layout_fn) dlsym(lib, "ggml_backend_rocmforge_abi_layout") : NULL;
    if (!layout) {
        fprintf(stderr, "ggml_backend_rocmforge_abi_layout not exported by %s\n", ROCMFORGE_LIB_PATH);
        return 1;
    }

    const size_t n_c = sizeof(c_rows) / sizeof(c_rows[0]);
    size_t n_rust = 0, n_match = 0;
    const char * what = NULL;
    const char * field = NULL;
    size_t value = 0;
    for (size_t i = 0; layout(i, &what, &field, &value); i++) {
        n_rust++;
        char cf[128];
        c_field_name(field, cf, sizeof(cf));
        struct row * r = NULL;
        for (size_t j = 0; j < n_c; j++) {
            if (strcmp(c_rows[j].what, what) == 0 && strcmp(c_rows[j].field, cf) == 0) {
                r = &c_rows[j];
                break;
            }
        }
        if (!r) {
            CHECK(r != NULL, "rust reports %s.%s = %zu, unknown to the C table", what, field[0] ? field : "(size)", value);
            continue;
        }
        r->seen = true;
        if (r->value == value) {
            n_match++;
        } else {
            CHECK(r->value == value, "%s.%s: rust %zu, ggml %zu", what, field[0] ? field : "(size)", value, r->value);
        }
    }
    CHECK(!layout(n_rust + 1000, &what, &field, &value), "index past the end must return false");
    CHECK(!layout(0, NULL, NULL, NULL), "NULL out-pointers must return false");

    // Every struct/field of ggml's headers that the backend mirrors must be in the report.
    for (size_t j = 0; j < n_c; j++) {
        CHECK(c_rows[j].seen, "%s.%s is not reported by the library (mirror missing or incomplete)", c_rows[j].what,
              c_rows[j].field[0] ? c_rows[j].field : "(size)");
    }
    printf("test_abi: %zu rows reported by rocmforge, %zu match ggml, %zu rows in the C table\n", n_rust, n_match, n_c);
    dlclose(lib);
    return rf_finish("test_abi");
}
