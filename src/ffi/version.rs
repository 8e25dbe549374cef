//! The versions this library was built for, exported to the header as macros (cbindgen) and
//! listed by `ggml_backend_get_features`; and the check of the host's ggml against them.

/// rocmforge's own version (the crate's; the shared library's soname carries its major).
pub const GGML_ROCMFORGE_VERSION: &str = "0.1.0";

/// The ggml release whose ABI (struct layouts, op and type numbers) this library mirrors.
/// A host built on any other ggml is refused at load time (a log line names both versions).
pub const GGML_ROCMFORGE_GGML_VERSION: &str = "0.26.0";

/// The ggml backend API version of the registry (`ggml_backend_reg.api_version`); ggml's
/// loader itself refuses a backend whose API version differs from its own.
pub const GGML_ROCMFORGE_BACKEND_API: i32 = 3;

/// Name/value pairs for `ggml_backend_get_features`, before the SIMD ones.
pub fn features() -> Vec<(String, String)> {
    vec![
        ("ROCMFORGE_VERSION".into(), GGML_ROCMFORGE_VERSION.into()),
        ("GGML_VERSION".into(), GGML_ROCMFORGE_GGML_VERSION.into()),
        ("BACKEND_API".into(), GGML_ROCMFORGE_BACKEND_API.to_string()),
    ]
}

/// Compares the host's `ggml_version()` (None: the host's ggml is not found, as in `cargo
/// test`, or too old to say) with the ggml this library was built for. The release part is
/// compared: "0.26.0-dev" or "0.26.0+abc" is 0.26.0.
pub fn check_host_ggml(host: Option<&str>) -> Result<(), String> {
    let Some(host) = host else {
        return Ok(());
    };
    let release = host.split(['-', '+']).next().unwrap_or("").trim();
    if release == GGML_ROCMFORGE_GGML_VERSION {
        Ok(())
    } else {
        Err(format!(
            "version {GGML_ROCMFORGE_VERSION} was built for ggml {GGML_ROCMFORGE_GGML_VERSION} \
             (backend API {GGML_ROCMFORGE_BACKEND_API}) but this process runs ggml {host}; \
             not registering (rebuild rocmforge against this ggml, or use ggml \
             {GGML_ROCMFORGE_GGML_VERSION})"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_agree_with_the_crate_and_the_abi() {
        assert_eq!(GGML_ROCMFORGE_VERSION, env!("CARGO_PKG_VERSION"));
        assert_eq!(
            GGML_ROCMFORGE_BACKEND_API,
            crate::ffi::abi::GGML_BACKEND_API_VERSION
        );
    }

    #[test]
    fn host_ggml_check() {
        assert!(check_host_ggml(None).is_ok());
        assert!(check_host_ggml(Some("0.26.0")).is_ok());
        assert!(check_host_ggml(Some("0.26.0-dev")).is_ok());
        let e = check_host_ggml(Some("0.27.1")).unwrap_err();
        assert!(
            e.contains("ggml 0.26.0") && e.contains("ggml 0.27.1"),
            "{e}"
        );
        assert!(check_host_ggml(Some("0.26.01")).is_err());
        assert!(check_host_ggml(Some("")).is_err());
    }
}
