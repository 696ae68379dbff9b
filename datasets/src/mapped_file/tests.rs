//! Mapped reads, files cut under them, the handler's registry, and faults that are not ours
//! (those in a child process: they must end it).

use std::os::fd::AsRawFd;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::*;

/// The tests here count on free registry slots (or take them all), so they run one at a time.
fn registry_lock() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The byte at `offset` of a pattern file: never zero, so zeros read back are never data.
fn pattern_byte(offset: usize) -> u8 {
    (offset % 251) as u8 + 1
}

fn write_pattern(path: &Path, len: usize) {
    std::fs::write(path, (0..len).map(pattern_byte).collect::<Vec<_>>()).unwrap();
}

/// A temporary folder holding `data.bin`, `len` bytes of the pattern.
fn pattern_file(len: usize) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data.bin");
    write_pattern(&path, len);
    (dir, path)
}

fn open(path: &Path) -> MappedFile {
    let file = File::open(path).unwrap();
    let len = file.metadata().unwrap().len();
    MappedFile::new(path, file, len)
}

/// Another writer cuts the file to `len` bytes.
fn cut(path: &Path, len: usize) {
    File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(len as u64)
        .unwrap();
}

fn read(file: &MappedFile, offset: usize, len: usize) -> Result<Vec<u8>> {
    let mut bytes = vec![0u8; len];
    file.read_at(&mut bytes, offset as u64)?;
    Ok(bytes)
}

fn assert_pattern(bytes: &[u8], offset: usize) {
    let expected: Vec<u8> = (offset..offset + bytes.len()).map(pattern_byte).collect();
    assert!(bytes == expected, "bytes at {offset} differ from the file");
}

fn assert_changed(result: Result<Vec<u8>>, path: &Path) {
    let error = result.expect_err("a read of a cut file must fail");
    assert!(matches!(error, Error::FileChanged { .. }), "{error}");
    assert!(
        error.to_string().contains(&path.display().to_string()),
        "{error}"
    );
}

#[test]
fn reads_come_from_the_map_and_the_final_page_from_pread() {
    let _lock = registry_lock();
    let page = page_size();
    let len = 5 * page + 100;
    let (dir, path) = pattern_file(len);
    let file = open(&path);
    assert!(file.is_mapped());
    assert_eq!(file.len(), len as u64);
    for (offset, count) in [
        (0, 10),
        (page - 3, 7),
        (3 * page + 5, 2 * page - 5),
        (5 * page - 1, 101),
        (0, len),
        (len, 0),
    ] {
        assert_pattern(&read(&file, offset, count).unwrap(), offset);
    }
    assert!(matches!(
        read(&file, len - 1, 2),
        Err(Error::InvalidArgument(_))
    ));

    let small = dir.path().join("small.bin");
    write_pattern(&small, page);
    let small = open(&small);
    assert!(!small.is_mapped(), "a file of one page is not worth a map");
    assert_pattern(&read(&small, 10, 100).unwrap(), 10);
}

#[test]
fn a_cut_under_a_reader_is_an_error_naming_the_file_and_stays_one() {
    let _lock = registry_lock();
    let page = page_size();
    let (_dir, path) = pattern_file(16 * page);
    let file = open(&path);
    assert!(file.is_mapped());
    assert_pattern(&read(&file, 10 * page, 64).unwrap(), 10 * page);

    cut(&path, 3 * page + 100);
    let repaired = sigbus::repaired_faults();
    assert_changed(read(&file, 10 * page, 64), &path);
    assert!(
        sigbus::repaired_faults() > repaired,
        "the read faulted and the handler repaired it"
    );
    // Bytes still in the file, but the mapping has failed for good.
    assert_changed(read(&file, 0, 64), &path);
    assert_changed(read(&file, 15 * page, 100), &path);
}

#[test]
fn the_page_holding_the_new_end_never_passes_its_zeros_off_as_data() {
    let _lock = registry_lock();
    let page = page_size();
    let (_dir, path) = pattern_file(16 * page);
    let file = open(&path);
    cut(&path, 2 * page + 100);
    // Bytes 2p+200.. read as zeros without a fault; the probe of page 3 faults.
    let repaired = sigbus::repaired_faults();
    assert_changed(read(&file, 2 * page + 200, 50), &path);
    assert!(sigbus::repaired_faults() > repaired);
}

#[test]
fn threads_reading_across_a_cut_get_the_file_bytes_or_an_error_never_zeros() {
    let _lock = registry_lock();
    let page = page_size();
    let len = 64 * page;
    let (_dir, path) = pattern_file(len);
    let file = open(&path);
    assert!(file.is_mapped());
    let window = 4098;
    let reads_before_cut = AtomicUsize::new(0);
    let errors_seen = std::thread::scope(|scope| {
        let readers: Vec<_> = (0..4u64)
            .map(|thread| {
                let (file, reads_before_cut) = (&file, &reads_before_cut);
                scope.spawn(move || {
                    let mut state = thread + 1;
                    let mut errors = 0;
                    for _ in 0..200_000 {
                        state = state
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        let offset = (state >> 33) as usize % (len - page - window);
                        match read(file, offset, window) {
                            Ok(bytes) => {
                                assert_pattern(&bytes, offset);
                                reads_before_cut.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(Error::FileChanged { .. }) => {
                                errors += 1;
                                if errors == 100 {
                                    break;
                                }
                            }
                            Err(error) => panic!("{error}"),
                        }
                    }
                    errors
                })
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(10);
        while reads_before_cut.load(Ordering::Relaxed) < 1000 && Instant::now() < deadline {
            std::thread::yield_now();
        }
        cut(&path, 20 * page + 123);
        readers
            .into_iter()
            .map(|reader| reader.join().unwrap())
            .collect::<Vec<_>>()
    });
    assert_eq!(errors_seen, [100; 4], "every reader saw the cut");
}

#[test]
fn a_full_registry_falls_back_to_pread_and_dropped_mappings_free_their_slots() {
    let _lock = registry_lock();
    let page = page_size();
    let (_dir, path) = pattern_file(4 * page);
    for _ in 0..2 * sigbus::SLOTS {
        assert!(open(&path).is_mapped(), "a dropped mapping frees its slot");
    }
    let held: Vec<MappedFile> = (0..=sigbus::SLOTS).map(|_| open(&path)).collect();
    let unmapped: Vec<&MappedFile> = held.iter().filter(|file| !file.is_mapped()).collect();
    assert!(!unmapped.is_empty(), "at most {} mappings", sigbus::SLOTS);
    assert_pattern(&read(unmapped[0], 100, 2 * page).unwrap(), 100);
    drop(held);
    assert!(open(&path).is_mapped());
}

/// The environment variable that tells a child which helper below to run.
const CHILD_ENV: &str = "STOKER_MAPPED_FILE_TEST_CHILD";

/// Runs the ignored test `name` of this binary in a child process (at most 60 s).
fn run_child(name: &str) -> Output {
    // The child dies of SIGBUS before its temporary folder is removed: it makes it under one
    // of this process's, removed when this returns.
    let scratch = tempfile::tempdir().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            name,
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, name)
        .env("TMPDIR", scratch.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!("the child running {name} did not end in 60 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

/// Whether this process is the child asked to run `name`.
fn is_child_for(name: &str) -> bool {
    std::env::var(CHILD_ENV).is_ok_and(|asked| asked == name)
}

/// In a child: cuts a mapped file under a read (an error, the child lives on), then touches a
/// page past the end of a file mapped without us, which no handler of ours may absorb.
fn fault_ours_then_one_outside() {
    let page = page_size();
    let dir = tempfile::tempdir().unwrap();
    let ours = dir.path().join("ours.bin");
    write_pattern(&ours, 4 * page);
    let file = open(&ours);
    assert!(file.is_mapped());
    cut(&ours, 0);
    assert_changed(read(&file, page, 10), &ours);
    println!("our fault was an error");

    let theirs = dir.path().join("theirs.bin");
    write_pattern(&theirs, 4 * page);
    let theirs_file = File::open(&theirs).unwrap();
    // SAFETY: a fresh read-only mapping of an open file, never unmapped: the process is
    // meant to die touching it.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4 * page,
            libc::PROT_READ,
            libc::MAP_SHARED,
            theirs_file.as_raw_fd(),
            0,
        )
    };
    assert_ne!(base, libc::MAP_FAILED);
    cut(&theirs, 0);
    println!("faulting outside our mappings");
    // SAFETY: inside the mapping just made; the file is cut, so this raises SIGBUS.
    let byte = unsafe { std::ptr::read_volatile(base.cast::<u8>().add(2 * page)) };
    println!("survived a fault outside our mappings (read {byte})");
    std::process::exit(3);
}

#[test]
#[ignore = "a helper: a_fault_outside_any_mapping_still_kills_the_process runs it in a child"]
fn child_faults_outside_any_mapping() {
    if is_child_for("mapped_file::tests::child_faults_outside_any_mapping") {
        fault_ours_then_one_outside();
    }
}

/// Runs the child test `name` (which calls [`fault_ours_then_one_outside`]), checks that our
/// fault came back as an error and that it went on to fault outside, and returns how it ended.
fn run_faulting_child(name: &str) -> (std::process::ExitStatus, String) {
    let output = run_child(name);
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(stdout.contains("our fault was an error"), "{stdout}");
    assert!(stdout.contains("faulting outside"), "{stdout}");
    (output.status, stdout)
}

#[test]
fn a_fault_outside_any_mapping_still_kills_the_process() {
    let (status, stdout) =
        run_faulting_child("mapped_file::tests::child_faults_outside_any_mapping");
    assert_eq!(status.signal(), Some(libc::SIGBUS), "{status:?}\n{stdout}");
}

/// The code the handler installed before ours exits with.
const PREVIOUS_HANDLER_EXIT: i32 = 42;

extern "C" fn previous_handler(
    _signal: libc::c_int,
    _info: *mut libc::siginfo_t,
    _context: *mut libc::c_void,
) {
    // SAFETY: _exit is async-signal-safe and ends the process at once.
    unsafe { libc::_exit(PREVIOUS_HANDLER_EXIT) };
}

#[test]
#[ignore = "a helper: a_fault_outside_any_mapping_goes_to_the_handler_installed_before runs it"]
fn child_chains_to_the_previous_handler() {
    if !is_child_for("mapped_file::tests::child_chains_to_the_previous_handler") {
        return;
    }
    // SAFETY: a zeroed sigaction is valid (SIG_DFL, empty mask); the handler set below has the
    // SA_SIGINFO signature, and the pointers are to live locals.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = previous_handler as *const () as libc::sighandler_t;
        action.sa_flags = libc::SA_SIGINFO;
        assert_eq!(
            libc::sigaction(libc::SIGBUS, &action, std::ptr::null_mut()),
            0
        );
    }
    fault_ours_then_one_outside();
}

#[test]
fn a_fault_outside_any_mapping_goes_to_the_handler_installed_before() {
    let (status, stdout) =
        run_faulting_child("mapped_file::tests::child_chains_to_the_previous_handler");
    assert_eq!(
        status.code(),
        Some(PREVIOUS_HANDLER_EXIT),
        "{status:?}\n{stdout}"
    );
}
