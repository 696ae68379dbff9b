//! The GPU decode lane's helper process as the Python package has it: the folders a
//! `STOKER_GPU_DECODE_HELPER=1` looks in for `stoker-lane-helper` (where this installation
//! keeps its commands, which is where pip put the package's own), and the helper itself, run
//! by that command through this module.

use std::ffi::OsString;
use std::path::PathBuf;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// Where this Python installation keeps its commands, in the order looked in: its scripts
/// folder, the user's scripts folder (`pip install --user`), and the folder of
/// `sys.executable` as Python names it (a virtual environment's `bin`, where the running
/// program's own path would name the interpreter the environment links to).
fn command_folders(py: Python<'_>) -> PyResult<Vec<PathBuf>> {
    let sysconfig = py.import("sysconfig")?;
    let mut folders: Vec<PathBuf> = vec![sysconfig
        .call_method1("get_path", ("scripts",))?
        .extract()?];
    let user = sysconfig.call_method1("get_preferred_scheme", ("user",))?;
    folders.push(
        sysconfig
            .call_method1("get_path", ("scripts", user))?
            .extract()?,
    );
    let executable: PathBuf = py.import("sys")?.getattr("executable")?.extract()?;
    folders.extend(executable.parent().map(PathBuf::from));
    let mut seen = Vec::with_capacity(folders.len());
    folders.retain(|folder| {
        let new = !folder.as_os_str().is_empty() && !seen.contains(folder);
        seen.push(folder.clone());
        new
    });
    Ok(folders)
}

/// The `stoker-lane-helper` that `STOKER_GPU_DECODE_HELPER` asks this process's loaders to
/// start: `None` when it asks for none; ValueError when the binary it names or finds is not
/// there.
#[pyfunction]
pub fn lane_helper(py: Python<'_>) -> PyResult<Option<PathBuf>> {
    stoker_gpu::helper_asked(
        std::env::var(stoker_gpu::HELPER_VARIABLE).ok().as_deref(),
        &command_folders(py)?,
        std::env::var_os("PATH").as_deref(),
    )
    .map_err(PyValueError::new_err)
}

/// Runs the helper on this process's stdin and stdout with `arguments` (the command's own,
/// which it takes none of) until a loader's input ends, the interpreter let go meanwhile; its
/// exit status.
#[pyfunction]
pub fn lane_helper_main(py: Python<'_>, arguments: Vec<OsString>) -> u8 {
    py.detach(|| stoker_lane_helper::run(&arguments))
}
