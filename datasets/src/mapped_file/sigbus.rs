//! The process-wide SIGBUS handler and the registry of mappings it may repair.
//!
//! Touching a page of a file mapping that lies wholly past the file's end (the file was cut
//! short after it was mapped) raises SIGBUS, whose default action kills the process. A mapping
//! registered here instead has the faulting page replaced by a page of zeros and is marked
//! changed; the faulting instruction then runs again and reads zeros, and the reader, which
//! checks the mark after copying, returns an error instead of the data. A SIGBUS at any other
//! address goes to the handler that was installed before ours (Rust's runtime installs one;
//! a host such as Python may have its own), or to the default action, so faults that are not
//! ours still end the process as they would have.
//!
//! The handler takes no lock and allocates nothing: the registry is a fixed array of slots,
//! each a small seqlock of atomics. A slot's `sequence` is odd while its owner writes it and
//! even otherwise; its value once the registration is written is the registration's
//! generation, and the mark stores that generation, so a mark left over from an earlier user
//! of the slot never fails a later one. A registration is withdrawn before its pages are
//! unmapped, so the handler never repairs an address range the process may have reused.
//!
//! The only system calls in the handler are `mmap`, `sigaction` and `raise`; `mmap` is not on
//! POSIX's list of async-signal-safe functions, but it is one system call with no user-space
//! state on Linux, which is what the handler relies on.

use std::sync::atomic::{fence, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

use tracing::{debug, warn};

/// Mappings registered at once, at most; a file mapped while all are taken is read with
/// `pread` instead. A dataset maps one token file, so this is many datasets' worth.
pub(crate) const SLOTS: usize = 256;

/// `si_code` of a SIGBUS raised by touching a mapped page past the end of its file (Linux's
/// `BUS_ADRERR`; the libc crate does not export it for glibc).
const BUS_ADRERR: libc::c_int = 2;

/// One registered address range.
struct Slot {
    /// Odd while the owner writes the slot; the generation of the registration otherwise.
    sequence: AtomicU64,
    /// First byte of the range.
    start: AtomicUsize,
    /// Length of the range in bytes; 0 when the slot is free.
    len: AtomicUsize,
    /// The generation of the registration whose range faulted (0: none has).
    changed: AtomicU64,
}

impl Slot {
    const fn new() -> Slot {
        Slot {
            sequence: AtomicU64::new(0),
            start: AtomicUsize::new(0),
            len: AtomicUsize::new(0),
            changed: AtomicU64::new(0),
        }
    }

    /// The slot's range and generation if it is registered and not being written.
    fn read(&self) -> Option<(usize, usize, u64)> {
        let before = self.sequence.load(Ordering::Acquire);
        if before % 2 == 1 {
            return None;
        }
        let start = self.start.load(Ordering::Relaxed);
        let len = self.len.load(Ordering::Relaxed);
        fence(Ordering::Acquire);
        let after = self.sequence.load(Ordering::Relaxed);
        (before == after && len > 0).then_some((start, len, before))
    }
}

static REGISTRY: [Slot; SLOTS] = [const { Slot::new() }; SLOTS];

/// The system page size, set before the handler is installed.
static PAGE_SIZE: AtomicUsize = AtomicUsize::new(0);

/// Faults repaired so far (for tests: proof that a read went through the handler).
static REPAIRED: AtomicU64 = AtomicU64::new(0);

/// The SIGBUS action that was in place before ours, for faults that are not ours.
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();

/// The system page size (4096 when the system will not say).
pub(crate) fn page_size() -> usize {
    static SIZE: OnceLock<usize> = OnceLock::new();
    *SIZE.get_or_init(|| {
        // SAFETY: sysconf reads a system constant; it has no preconditions.
        let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        usize::try_from(size)
            .ok()
            .filter(|size| size.is_power_of_two())
            .unwrap_or(4096)
    })
}

/// Installs the handler once per process; whether it is in place.
fn ensure_installed() -> bool {
    static INSTALLED: OnceLock<bool> = OnceLock::new();
    *INSTALLED.get_or_init(|| {
        PAGE_SIZE.store(page_size(), Ordering::Release);
        // SAFETY: a zeroed sigaction is a valid value (SIG_DFL, empty mask, no flags); the
        // fields that matter are set below.
        let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
        action.sa_sigaction = on_sigbus as *const () as libc::sighandler_t;
        action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_RESTART;
        // SAFETY: as above, a zeroed sigaction is a valid value; sigaction overwrites it.
        let mut previous: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: sigemptyset writes the set through a valid pointer; sigaction reads `action`
        // and writes the old action into `previous`, both valid locals. The handler it
        // installs only touches statics that are valid from the start.
        let status = unsafe {
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(libc::SIGBUS, &action, &mut previous)
        };
        if status != 0 {
            warn!(
                error = %std::io::Error::last_os_error(),
                "cannot install the SIGBUS handler; data files are read with pread"
            );
            return false;
        }
        // Until this is set, a SIGBUS outside our mappings gets the default action, which is
        // what `previous` almost always is this early.
        let _ = PREVIOUS.set(previous);
        debug!("sigbus handler installed");
        true
    })
}

/// A range registered with the handler; withdrawn on drop.
pub(crate) struct Registration {
    slot: &'static Slot,
    generation: u64,
}

impl Registration {
    /// Registers `[start, start + len)` (whole pages of one mapping), installing the handler
    /// on first use. `None` when the handler cannot be installed or every slot is taken.
    pub(crate) fn new(start: usize, len: usize) -> Option<Registration> {
        if len == 0 || !ensure_installed() {
            return None;
        }
        for slot in &REGISTRY {
            let sequence = slot.sequence.load(Ordering::Acquire);
            if sequence % 2 == 1 || slot.len.load(Ordering::Acquire) != 0 {
                continue;
            }
            // Claiming makes the sequence odd; a slot taken meanwhile has another sequence.
            if slot
                .sequence
                .compare_exchange(sequence, sequence + 1, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
            {
                continue;
            }
            fence(Ordering::Release);
            slot.start.store(start, Ordering::Relaxed);
            slot.len.store(len, Ordering::Relaxed);
            let generation = sequence + 2;
            slot.sequence.store(generation, Ordering::Release);
            return Some(Registration { slot, generation });
        }
        None
    }

    /// Whether a fault in the range has been repaired (the file was cut short under it).
    ///
    /// Reads of the mapping before this call are ordered before it: a reader that copied
    /// zeros from a repaired page sees the mark, because the handler sets the mark before it
    /// maps the zeros in.
    pub(crate) fn changed(&self) -> bool {
        fence(Ordering::Acquire);
        self.slot.changed.load(Ordering::Acquire) == self.generation
    }

    /// Marks the range changed, as a repaired fault does (a short read of the file found it
    /// cut).
    pub(crate) fn mark_changed(&self) {
        self.slot.changed.store(self.generation, Ordering::SeqCst);
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let slot = self.slot;
        slot.sequence.store(self.generation + 1, Ordering::Relaxed);
        fence(Ordering::Release);
        slot.len.store(0, Ordering::Relaxed);
        slot.start.store(0, Ordering::Relaxed);
        slot.sequence.store(self.generation + 2, Ordering::Release);
    }
}

/// Repairs a fault at `address` if it lies in a registered range: marks the range changed,
/// then maps a page of zeros over the faulting page. Whether it did.
fn repair(address: usize) -> bool {
    let page = PAGE_SIZE.load(Ordering::Acquire);
    if page == 0 {
        return false;
    }
    for slot in &REGISTRY {
        let Some((start, len, generation)) = slot.read() else {
            continue;
        };
        if address < start || address - start >= len {
            continue;
        }
        // The mark goes first: a thread that reads the zeros without faulting must find it.
        slot.changed.store(generation, Ordering::SeqCst);
        let page_start = address & !(page - 1);
        // SAFETY: the page lies inside a read-only file mapping that its owner keeps until
        // after withdrawing the registration (and the owner is reading it now, or the fault
        // would not be here); replacing it with a private anonymous page changes no memory the
        // program owns otherwise, and the owner's munmap later removes it with the rest.
        let zeros = unsafe {
            libc::mmap(
                page_start as *mut libc::c_void,
                page,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if zeros == libc::MAP_FAILED {
            return false;
        }
        REPAIRED.fetch_add(1, Ordering::Relaxed);
        return true;
    }
    false
}

/// The SIGBUS handler: repairs faults in registered ranges, passes everything else on.
extern "C" fn on_sigbus(
    signal: libc::c_int,
    info: *mut libc::siginfo_t,
    context: *mut libc::c_void,
) {
    // SAFETY: with SA_SIGINFO the kernel passes a valid siginfo_t (checked for null anyway);
    // for si_code BUS_ADRERR, raised by the kernel for a bad access, si_addr is the faulting
    // address.
    let fault_address = unsafe {
        info.as_ref()
            .filter(|info| info.si_code == BUS_ADRERR)
            .map(|info| info.si_addr() as usize)
    };
    if fault_address.is_some_and(repair) {
        return;
    }
    pass_on(signal, info, context);
}

/// Hands a SIGBUS that is not ours to the action that was in place before ours.
fn pass_on(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    let previous = PREVIOUS.get();
    let handler = previous.map_or(libc::SIG_DFL, |previous| previous.sa_sigaction);
    // SAFETY: info is the kernel's or null, as above.
    let sent_by_a_process = unsafe { info.as_ref() }.is_none_or(|info| info.si_code <= 0);
    if handler == libc::SIG_IGN && sent_by_a_process {
        return;
    }
    if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
        // The default action (a fault cannot be ignored: the kernel would force the default
        // too). SIGBUS is blocked while this runs, so the raised one is delivered, with the
        // default action, as the handler returns.
        // SAFETY: a zeroed sigaction is SIG_DFL with an empty mask; sigaction and raise are
        // async-signal-safe.
        unsafe {
            let default: libc::sigaction = std::mem::zeroed();
            libc::sigaction(signal, &default, std::ptr::null_mut());
            libc::raise(signal);
        }
        return;
    }
    let takes_info = previous.is_some_and(|previous| previous.sa_flags & libc::SA_SIGINFO != 0);
    if takes_info {
        // SAFETY: the previous action was installed with SA_SIGINFO, so its handler has this
        // signature; it gets the arguments the kernel gave us.
        let previous_handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            unsafe { std::mem::transmute(handler) };
        previous_handler(signal, info, context);
    } else {
        // SAFETY: the previous action is a plain handler taking the signal number.
        let previous_handler: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(handler) };
        previous_handler(signal);
    }
}

/// Faults in registered ranges repaired so far in this process.
#[cfg(test)]
pub(crate) fn repaired_faults() -> u64 {
    REPAIRED.load(Ordering::Relaxed)
}
