//! A pipe's work on a batch's images on the GPU: each image's acceptance and place (the whole
//! frame, or with region decoding the region of it nvJPEG takes), gathered into sub-batches that
//! fit the arena; for each, nvJPEG's batched decode into the arena, the crop kernel's launch
//! into the batch's device rows, and a sub-batch one image spoils retried image by
//! image (one refused by region tried whole, the stream waited for after each failure), each
//! image's own status deciding whether it is built on the CPU; and the poison laid
//! over each place before the decode, by which a place the decode left unwritten is found
//! (where [`FAULT_VARIABLE`] asks, some places are poisoned again after the decode, to test
//! that finding).

use super::*;
use crate::decode::TailParams;

/// A test hook: every image whose sample number is a multiple of this count has its place
/// poisoned again after nvJPEG wrote it, as if the decode had left it unwritten, so the lane
/// must find it and build its row on the CPU. Unset (or not a positive count, with a
/// warning): no image.
pub const FAULT_VARIABLE: &str = "STOKER_GPU_DECODE_FAULT_EVERY";

/// [`FAULT_VARIABLE`]'s count, from its value if set.
pub(super) fn fault_every(value: Option<&str>) -> Option<u64> {
    let text = value?.trim();
    match text.parse::<u64>() {
        Ok(every) if every > 0 => Some(every),
        _ => {
            tracing::warn!(
                value = text,
                "{FAULT_VARIABLE} is not a positive count; ignored"
            );
            None
        }
    }
}

impl Pipe {
    /// Decodes and crops `items` into output buffer `ring` (the GPU part of a batch): which
    /// device row each image got, and which images go to the CPU, those the decode left
    /// unwritten keeping their device row. The pipe's work is done when it returns.
    pub(super) fn decode_set(
        &mut self,
        ring: usize,
        items: Vec<LaneItem>,
    ) -> std::result::Result<DecodedSet, GpuDecodeError> {
        let out = self.memory.ring_ptr(ring);
        let mut decoded: Vec<Decoded> = Vec::with_capacity(items.len());
        let mut fallback: Vec<CpuRow> = Vec::new();
        let mut pending: Vec<Pending> = Vec::new();
        // Bytes of the arena and of the staging buffer the pending images take.
        let (mut used, mut staged) = (0usize, 0usize);
        for item in items {
            // The lane's half of the acceptance decision: nvJPEG's own parse of the whole
            // stream must read the frame the decode threads' scan read; the place is sized
            // from what both read.
            let checked = Instant::now();
            let placement = self
                .decoder
                .read(&item.image.bytes)
                .ok_or(Decline::DecoderRefused)
                .and_then(|reading| accept(&item.frame, &reading, ALIGN));
            // With region decoding, the window's region alone where nvJPEG takes it (asked
            // with the parse `read` just made): the place is the region's.
            let region = match &placement {
                Ok(placement) if self.roi => region_for(
                    &item.image.window,
                    (placement.width, placement.height),
                    item.frame.chroma.mcu(),
                )
                .filter(|decode| self.decoder.takes_region(&decode.region)),
                _ => None,
            };
            add_since(&self.stats.check_ns, checked);
            let (placement, whole) = match (placement, region) {
                (Ok(whole), Some(decode)) => (decode.region.placement(ALIGN), whole),
                (Ok(whole), None) => (whole, whole),
                (Err(_), _) => {
                    fallback.push(CpuRow::of(&item));
                    continue;
                }
            };
            if placement.place > self.memory.arena_bytes {
                fallback.push(CpuRow::of(&item));
                continue;
            }
            let encoded = self.staged_len(&item);
            if used + placement.place > self.memory.arena_bytes
                || staged + encoded > self.staging_bytes
            {
                self.flush(&mut pending, out, &mut decoded, &mut fallback)?;
                (used, staged) = (0, 0);
            }
            pending.push(Pending {
                item,
                placement,
                offset: used,
                region,
                whole,
            });
            used += placement.place;
            staged += encoded;
        }
        self.flush(&mut pending, out, &mut decoded, &mut fallback)?;

        // Every place the kernel cropped from must have been written by the decode: one still
        // holding the poison laid before it is built on the CPU, and its row on the device
        // replaced by the CPU's.
        let unwritten = self.unwritten(&decoded)?;
        if !unwritten.is_empty() {
            tracing::debug!(
                images = unwritten.len(),
                pipe = self.index,
                "nvJPEG reported success without writing some images; building them on the CPU"
            );
        }
        self.stats
            .fallback_rows
            .fetch_add((fallback.len() + unwritten.len()) as u64, Ordering::Relaxed);
        self.stats
            .gpu_rows
            .fetch_add((decoded.len() - unwritten.len()) as u64, Ordering::Relaxed);
        let by_region = decoded
            .iter()
            .enumerate()
            .filter(|(k, d)| d.by_region && !unwritten.contains(k))
            .count();
        self.stats
            .roi_rows
            .fetch_add(by_region as u64, Ordering::Relaxed);
        Ok(DecodedSet {
            out,
            rows: decoded.iter().map(|d| d.cpu.row as u32).collect(),
            cpu: fallback
                .iter()
                .map(|row| (*row, None))
                .chain(unwritten.iter().map(|&k| (decoded[k].cpu, Some(k))))
                .collect(),
        })
    }

    /// Decodes the pending images and crops them into the output rows from `decoded.len()`
    /// on; images nvJPEG refuses go to `fallback`. Fails only when the CUDA context broke.
    fn flush(
        &mut self,
        pending: &mut Vec<Pending>,
        out: u64,
        decoded: &mut Vec<Decoded>,
        fallback: &mut Vec<CpuRow>,
    ) -> std::result::Result<(), GpuDecodeError> {
        if pending.is_empty() {
            return Ok(());
        }
        let error = match self.attempt(pending, out, decoded) {
            Ok(()) => {
                self.held = pending.drain(..).map(|p| p.item).collect();
                return Ok(());
            }
            Err(broken @ GpuDecodeError::Broken(_)) => return Err(broken),
            Err(error) => error,
        };
        // One image spoils its whole sub-batch (nvjpegDecodeBatched has one status for all):
        // each is tried alone (a lone image has had its try), and one refused by region is
        // tried whole, so each image's own status decides, and which rows go to the CPU
        // depends on the images only, not on how they were grouped.
        tracing::debug!(%error, images = pending.len(), pipe = self.index, "the GPU lane tries a sub-batch's images alone");
        let alone = pending.len() == 1;
        let mut held = Vec::new();
        for mut one in std::mem::take(pending) {
            let tried = match (!alone).then(|| self.decoded_alone(&one, out, decoded)) {
                Some(Ok(true)) => Ok(true),
                Some(Err(broken)) => Err(broken),
                None | Some(Ok(false)) => match one.decode_whole(self.memory.arena_bytes) {
                    true => self.decoded_alone(&one, out, decoded),
                    false => Ok(false),
                },
            };
            match tried {
                Ok(true) => held.push(one.item),
                Ok(false) => fallback.push(CpuRow::of(&one.item)),
                Err(broken) => {
                    self.held = held;
                    return Err(broken);
                }
            }
        }
        self.held = held;
        Ok(())
    }

    /// Decodes and crops one image alone; whether it went to the GPU (its work is done then,
    /// since the next image reuses the arena). Fails only when the CUDA context broke.
    fn decoded_alone(
        &mut self,
        one: &Pending,
        out: u64,
        decoded: &mut Vec<Decoded>,
    ) -> std::result::Result<bool, GpuDecodeError> {
        match self.attempt(std::slice::from_ref(one), out, decoded) {
            Ok(()) => {}
            Err(broken @ GpuDecodeError::Broken(_)) => return Err(broken),
            Err(_) => return Ok(false),
        }
        // SAFETY: the event is the pipe's own.
        match unsafe { result::event::synchronize(self.done) } {
            Err(sticky) if is_sticky(&sticky) => Err(GpuDecodeError::Broken(format!(
                "cuEventSynchronize: {}, after an image decoded alone",
                describe(sticky)
            ))),
            _ => Ok(true),
        }
    }

    /// [`Pipe::run_batch`], and after a failure a wait for whatever the failed calls queued on
    /// the pipe's stream (a copy of the staged JPEGs nvJPEG may still be making), so the next
    /// try may reuse the staging and the decode parameters. That wait failing is an error of
    /// the work queued before, which CUDA keeps for every later call of the context: the
    /// context broke, and the lane says so rather than send image after image to the CPU.
    fn attempt(
        &mut self,
        pending: &[Pending],
        out: u64,
        decoded: &mut Vec<Decoded>,
    ) -> std::result::Result<(), GpuDecodeError> {
        let tried = self.run_batch(pending, out, decoded);
        if let Err(error) = &tried {
            // SAFETY: the pipe's own stream.
            match unsafe { result::stream::synchronize(self.stream) } {
                Err(sticky) if is_sticky(&sticky) => {
                    return Err(GpuDecodeError::Broken(format!(
                        "cuStreamSynchronize: {}, after {error}",
                        describe(sticky)
                    )));
                }
                Err(other) => {
                    tracing::debug!(error = %describe(other), "waiting for a GPU lane pipe's stream after a failed decode")
                }
                Ok(()) => {}
            }
        }
        tried
    }

    fn run_batch(
        &mut self,
        pending: &[Pending],
        out: u64,
        decoded: &mut Vec<Decoded>,
    ) -> std::result::Result<(), GpuDecodeError> {
        let arena = self.memory.arenas[self.index];
        let first = decoded.len();
        if first + pending.len() > self.sentinel_rows {
            return Err(GpuDecodeError::Unsupported(format!(
                "{} images in a batch of at most {} rows",
                first + pending.len(),
                self.sentinel_rows
            )));
        }
        // The state, arena and parameters are free once the pipe's last work is done.
        let waited = Instant::now();
        // SAFETY: the event is the pipe's own.
        unsafe { result::event::synchronize(self.done) }.map_err(driver("cuEventSynchronize"))?;
        add_since(&self.stats.pipe_wait_ns, waited);
        self.held.clear();
        // SAFETY: the staging buffer is the pipe's own page-locked allocation of
        // `staging_bytes`, and nvJPEG's reads of it from the last decode are done (the copies
        // come before the decode the event above follows).
        let staging = unsafe {
            std::slice::from_raw_parts_mut(self.staging.cast::<u8>(), self.staging_bytes)
        };
        let mut bytes: Vec<&[u8]> = Vec::with_capacity(pending.len());
        let mut rest = staging;
        for p in pending {
            let len = self.staged_len(&p.item);
            if len == 0 || len > rest.len() {
                bytes.push(&p.item.image.bytes[..]);
                continue;
            }
            let (place, after) = rest.split_at_mut(len);
            place.copy_from_slice(&p.item.image.bytes);
            bytes.push(place);
            rest = after;
        }
        let mut outputs: Vec<Image> = pending
            .iter()
            .map(|p| Image::rgb(arena + p.offset as u64, p.placement.pitch))
            .collect();
        // Poison the places first: a place the decode leaves unwritten is found by its
        // sentinel (`unwritten`), never cropped as this sample.
        let span_start = pending[0].offset;
        let span_end = pending
            .iter()
            .map(|p| p.offset + p.placement.place)
            .max()
            .unwrap_or(span_start);
        // SAFETY: the span lies in the pipe's arena (each place was fitted in it), starts on
        // an ALIGN boundary and is a whole number of ALIGN blocks, and nothing else uses it now.
        unsafe { self.poison(arena + span_start as u64, span_end - span_start) }?;
        let decoding = Instant::now();
        let regions: Vec<_> = pending
            .iter()
            .map(|p| p.region.map(|decode| decode.region))
            .collect();
        // SAFETY: each output lies in the pipe's arena, sized from the frame nvJPEG's parse and
        // the marker scan agreed on (or from the region of it nvJPEG said it takes); the
        // stream is the pipe's, and its last decode is done (waited for above).
        let result = unsafe {
            self.decoder
                .decode(0, &bytes, &mut outputs, &regions, self.stream)
        };
        add_since(&self.stats.decode_call_ns, decoding);
        result?;
        if let Some(every) = self.fault_every {
            for p in pending.iter().filter(|p| p.item.image.sample % every == 0) {
                // SAFETY: the place lies in the pipe's arena, starts on an ALIGN boundary and
                // its whole ALIGN blocks are the image's; queued after the decode that wrote it.
                unsafe { self.poison(arena + p.offset as u64, p.placement.place) }?;
            }
        }
        let launching = Instant::now();
        let items: Vec<CropItem> = pending
            .iter()
            .enumerate()
            .map(|(k, p)| {
                // Decoded by region: the window as seen from the region's corner.
                let window = p.region.map_or(p.item.image.window, |decode| decode.window);
                let mut crop = CropItem::new(
                    &window,
                    (p.placement.width, p.placement.height),
                    self.out,
                    p.item.image.flip,
                    (first + k) as u32,
                );
                crop.src = arena + p.offset as u64;
                // The place's last bytes, which the kernel copies to sentinel row `first + k`.
                let len = p.placement.decoded.min(SENTINEL);
                crop.sentinel = arena + (p.offset + p.placement.decoded - len) as u64;
                crop.sentinel_len = len as u32;
                crop
            })
            .collect();
        let params = self.memory.params[self.index];
        let (out_w, out_h) = (self.out.0 as i32, self.out.1 as i32);
        let blocks = (self.out.0 * self.out.1).div_ceil(kernel::BLOCK);
        let size = std::mem::size_of_val(items.as_slice());
        // SAFETY: both parameter buffers hold a batch's items (`items.len()` <= batch rows)
        // and the pipe's previous kernel is done (waited for above), so neither is read now;
        // the output rows lie in this batch's ring buffer; the arguments match the kernel's
        // signature.
        unsafe {
            std::ptr::copy_nonoverlapping(
                items.as_ptr().cast::<u8>(),
                self.host_params.cast::<u8>(),
                size,
            );
            sys::cuMemcpyHtoDAsync_v2(params, self.host_params, size, self.stream)
                .result()
                .map_err(driver("cuMemcpyHtoDAsync"))?;
            let sentinels = self.memory.sentinels_ptr(self.index);
            let (mut params_arg, mut out_arg, mut w_arg, mut h_arg, mut sentinels_arg) =
                (params, out, out_w, out_h, sentinels);
            let mut tail_arg = self.tail.params();
            let mut args: [*mut c_void; 6] = [
                (&mut params_arg as *mut u64).cast(),
                (&mut out_arg as *mut u64).cast(),
                (&mut w_arg as *mut i32).cast(),
                (&mut h_arg as *mut i32).cast(),
                (&mut sentinels_arg as *mut u64).cast(),
                (&mut tail_arg as *mut TailParams).cast(),
            ];
            result::launch_kernel(
                self.kernel.function,
                (blocks, items.len() as u32, 1),
                (kernel::BLOCK, 1, 1),
                0,
                self.stream,
                &mut args,
            )
            .map_err(driver("cuLaunchKernel"))?;
            // The sub-batch's sentinel rows (`first` on, in range: checked above) in one copy
            // to the pipe's page-locked buffer, read only after the pipe's event has passed.
            let (offset, len) = (first * SENTINEL, pending.len() * SENTINEL);
            sys::cuMemcpyDtoHAsync_v2(
                self.sentinels.cast::<u8>().add(offset).cast::<c_void>(),
                sentinels + offset as u64,
                len,
                self.stream,
            )
            .result()
            .map_err(driver("cuMemcpyDtoHAsync"))?;
            result::event::record(self.done, self.stream).map_err(driver("cuEventRecord"))?;
        }
        add_since(&self.stats.launch_ns, launching);
        decoded.extend(pending.iter().map(|p| Decoded {
            cpu: CpuRow::of(&p.item),
            decoded: p.placement.decoded,
            sentinel_len: p.placement.decoded.min(SENTINEL),
            by_region: p.region.is_some(),
        }));
        Ok(())
    }

    /// Lays the poison over `bytes` of the arena from `start`, on the pipe's stream.
    ///
    /// # Safety
    /// The range lies in the pipe's arena, `start` and `bytes` are multiples of 4, and no work
    /// but the pipe's own, ordered on its stream, uses the range.
    unsafe fn poison(&self, start: u64, bytes: usize) -> std::result::Result<(), GpuDecodeError> {
        // SAFETY: as the caller promises.
        unsafe { sys::cuMemsetD32Async(start, POISON, bytes / 4, self.stream) }
            .result()
            .map_err(driver("cuMemsetD32Async"))
    }

    /// The images of `decoded` (by index) whose place still holds the poison laid before their
    /// decode: nvJPEG reported success without writing them. Waits for the pipe's work.
    fn unwritten(&self, decoded: &[Decoded]) -> std::result::Result<Vec<usize>, GpuDecodeError> {
        if decoded.is_empty() {
            return Ok(Vec::new());
        }
        // SAFETY: the event is the pipe's own.
        unsafe { result::event::synchronize(self.done) }.map_err(driver("cuEventSynchronize"))?;
        // SAFETY: the pipe's page-locked sentinel buffer of `sentinel_rows` sentinels, written
        // by copies that are done (the event above follows them).
        let sentinels = unsafe {
            std::slice::from_raw_parts(self.sentinels.cast::<u8>(), self.sentinel_rows * SENTINEL)
        };
        Ok(decoded
            .iter()
            .enumerate()
            .filter(|(k, d)| {
                let got = &sentinels[k * SENTINEL..k * SENTINEL + d.sentinel_len];
                got == poison_tail(d.decoded, d.sentinel_len).as_slice()
            })
            .map(|(k, _)| k)
            .collect())
    }
}

/// An image waiting for its sub-batch's decode: where in the arena, sized from the agreed
/// frame (or from the region of it decoded).
struct Pending {
    item: LaneItem,
    placement: Placement,
    offset: usize,
    /// The region decoded instead of the whole image, and the window seen from its corner.
    region: Option<RegionDecode>,
    /// The whole image's placement (`placement` too when no region is decoded).
    whole: Placement,
}

impl Pending {
    /// Makes the image one decoded whole, alone at the arena's start, when it was to be
    /// decoded by region and its whole decode fits an arena of `arena_bytes`; whether it did.
    fn decode_whole(&mut self, arena_bytes: usize) -> bool {
        if self.region.is_none() || self.whole.place > arena_bytes {
            return false;
        }
        self.placement = self.whole;
        self.offset = 0;
        self.region = None;
        true
    }
}

/// An image decoded and cropped into device row `k` (its index in the batch's list), with
/// what its sentinel is checked against.
struct Decoded {
    cpu: CpuRow,
    decoded: usize,
    sentinel_len: usize,
    /// Decoded from a region of its image.
    by_region: bool,
}

/// The 32-bit pattern a pipe lays over the places of a sub-batch before decoding into them.
const POISON: u32 = 0xE1_96_C3_5A;

/// The last `len` bytes of a poisoned place of `decoded` bytes (places start on a multiple of
/// 4, the poison's period).
fn poison_tail(decoded: usize, len: usize) -> Vec<u8> {
    let pattern = POISON.to_le_bytes();
    (decoded - len..decoded).map(|at| pattern[at % 4]).collect()
}

/// Whether `error` is one CUDA keeps for every later call of its context (a kernel's fault:
/// an illegal address or instruction, a failed launch, an uncorrectable ECC error...), as the
/// CUDA programming guide lists them, rather than one of a call alone.
fn is_sticky(error: &DriverError) -> bool {
    use sys::cudaError_enum::*;
    matches!(
        error.0,
        CUDA_ERROR_ILLEGAL_ADDRESS
            | CUDA_ERROR_LAUNCH_FAILED
            | CUDA_ERROR_ILLEGAL_INSTRUCTION
            | CUDA_ERROR_MISALIGNED_ADDRESS
            | CUDA_ERROR_INVALID_ADDRESS_SPACE
            | CUDA_ERROR_INVALID_PC
            | CUDA_ERROR_HARDWARE_STACK_ERROR
            | CUDA_ERROR_ASSERT
            | CUDA_ERROR_ECC_UNCORRECTABLE
            | CUDA_ERROR_LAUNCH_TIMEOUT
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kernels_fault_breaks_the_context_a_calls_own_error_does_not() {
        use cudarc::driver::sys::cudaError_enum::*;
        assert!(is_sticky(&DriverError(CUDA_ERROR_ILLEGAL_ADDRESS)));
        assert!(is_sticky(&DriverError(CUDA_ERROR_LAUNCH_FAILED)));
        assert!(!is_sticky(&DriverError(CUDA_ERROR_INVALID_VALUE)));
        assert!(!is_sticky(&DriverError(CUDA_ERROR_INVALID_CONTEXT)));
        assert!(!is_sticky(&DriverError(
            CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
        )));
    }

    #[test]
    fn the_fault_hook_takes_a_positive_count_and_ignores_anything_else() {
        assert_eq!(fault_every(None), None);
        assert_eq!(fault_every(Some("3")), Some(3));
        assert_eq!(fault_every(Some(" 1 ")), Some(1));
        for ignored in ["0", "-1", "every", ""] {
            assert_eq!(fault_every(Some(ignored)), None, "{ignored:?}");
        }
    }

    #[test]
    fn a_poisoned_places_tail_is_the_pattern_at_its_offset() {
        let pattern = POISON.to_le_bytes();
        // A place of 10 bytes: its last 8 start at byte 2 of the 4-byte pattern.
        let tail = poison_tail(10, 8);
        assert_eq!(tail.len(), 8);
        assert_eq!(tail[0], pattern[2]);
        assert_eq!(tail[2], pattern[0]);
        assert!(poison_tail(4, 0).is_empty());
    }
}
