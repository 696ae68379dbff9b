//! Finding the CUDA libraries the lane loads at run time (nvJPEG, NVRTC): in the folders the
//! caller names (the Python package passes those of the NVIDIA wheels it finds), then those of
//! `STOKER_CUDA_LIB_DIRS` (colon-separated), then `$CUDA_HOME/lib64`, `$CUDA_PATH/lib64` and
//! the toolkit's usual `/usr/local/cuda/lib64`, and last the dynamic loader's own search.

use std::path::PathBuf;
use std::sync::Mutex;

/// The folders searched, in order, after `first`.
pub fn search_dirs(first: &[PathBuf]) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = first.to_vec();
    if let Some(list) = std::env::var_os("STOKER_CUDA_LIB_DIRS") {
        dirs.extend(std::env::split_paths(&list));
    }
    for variable in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(root) = std::env::var_os(variable) {
            dirs.push(PathBuf::from(root).join("lib64"));
        }
    }
    dirs.push(PathBuf::from("/usr/local/cuda/lib64"));
    dirs
}

/// Loads the first of `names` found in [`search_dirs`]`(first)`, or by name through the
/// dynamic loader, with its symbols global (so a later `dlopen` of its soname, such as
/// cudarc's, finds this copy); it stays loaded for the life of the process. Returns where it
/// came from, or what was tried.
pub fn preload(names: &[&str], first: &[PathBuf]) -> Result<String, String> {
    static LOADED: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());
    let mut loaded = LOADED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, from)) = loaded
        .iter()
        .find(|(name, _)| names.contains(&name.as_str()))
    {
        return Ok(from.clone());
    }
    let mut tried = Vec::new();
    let candidates = search_dirs(first)
        .into_iter()
        .flat_map(|dir| names.iter().map(move |name| dir.join(name)))
        .filter(|path| path.is_file())
        .map(|path| path.to_string_lossy().into_owned())
        .chain(names.iter().map(|name| name.to_string()));
    for candidate in candidates {
        // SAFETY: loading a CUDA library runs its initialisers, which only set up its state.
        let opened = unsafe {
            libloading::os::unix::Library::open(
                Some(&candidate),
                libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_GLOBAL,
            )
        };
        match opened {
            Ok(library) => {
                // Kept loaded for the process's life: cudarc and the lane hold its symbols.
                std::mem::forget(library);
                let name = names
                    .iter()
                    .find(|name| candidate.ends_with(*name))
                    .unwrap_or(&names[0]);
                loaded.push((name.to_string(), candidate.clone()));
                return Ok(candidate);
            }
            Err(error) => tried.push(format!("{candidate}: {error}")),
        }
    }
    Err(format!("tried {}", tried.join("; ")))
}

/// Folders that may hold the CUDA libraries in tests: the NVIDIA wheels of the workspace's
/// virtualenv (`./dev test` makes it before the Rust suites run, with nvJPEG's wheel; in CI it
/// has torch's CUDA wheels, NVRTC among them).
#[cfg(test)]
pub(crate) fn venv_library_dirs() -> Vec<PathBuf> {
    let venv = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/lib");
    let mut dirs = Vec::new();
    for python in std::fs::read_dir(&venv).into_iter().flatten().flatten() {
        let nvidia = python.path().join("site-packages/nvidia");
        for package in std::fs::read_dir(nvidia).into_iter().flatten().flatten() {
            dirs.push(package.path().join("lib"));
        }
    }
    dirs
}
