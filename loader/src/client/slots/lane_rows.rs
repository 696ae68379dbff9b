//! What a slot carries beside its bytes while it is out of its pool: the rows of its batch that
//! a decode lane left on a device ([`LaneRows`]; the GPU decode lane's, from `stoker-gpu`),
//! found again from any pointer into the slot by whoever hands the batch to the training loop.

/// Rows of one batch a decode lane built on a device rather than in the slot: `shape()[0]`
/// rows of uint8 `(height, width, 3)`, C order, from [`LaneRows::ptr`], row `k` standing for
/// the batch's row `positions()[k]`. They stay valid while this value is held.
pub trait LaneRows: Send + Sync + std::fmt::Debug {
    /// Device address of the first row.
    fn ptr(&self) -> u64;

    /// The batch row of each device row.
    fn positions(&self) -> &[u32];

    /// (rows, height, width, 3).
    fn shape(&self) -> [usize; 4];

    /// The device's ordinal.
    fn device(&self) -> usize;

    /// Makes `stream` wait (on the device) until the rows are written.
    ///
    /// # Safety
    /// `stream` is a live stream of the device's primary context, or 0 (its legacy default
    /// stream).
    unsafe fn wait_on(&self, stream: usize) -> Result<(), String>;

    /// Keeps the rows until the work queued on `stream` so far (the copies reading them) is
    /// done, whoever else lets go of them first.
    ///
    /// # Safety
    /// As for [`LaneRows::wait_on`].
    unsafe fn keep_until(self: std::sync::Arc<Self>, stream: usize) -> Result<(), String>;
}
