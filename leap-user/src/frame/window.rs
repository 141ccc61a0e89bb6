//! How many frames a datagram link holds: in assembly (the receive window)
//! and for NACKs (the retransmit buffer). Both follow the frames the ring
//! keeps in flight, within a bound on the memory they may take.
//!
//! A receiver may hold every frame in flight at once (the head sends
//! `inflight` frames back to back; each hop forwards them in order), and a
//! sender must still have the oldest of them when its receiver NACKs it. A
//! window smaller than that drops whole frames as `out_of_window`, and a
//! retransmit buffer smaller than that answers NACKs with "unknown": the
//! ring then waits for the head to send frames again.
//!
//! ```
//! use leap::frame::window::{DEFAULT_WINDOW_MEMORY, Windows};
//!
//! let w = Windows::new(48, 16_392, 0, 0, DEFAULT_WINDOW_MEMORY).unwrap();
//! assert_eq!((w.window, w.keep_frames), (64, 128));
//! assert!(w.memory <= DEFAULT_WINDOW_MEMORY);
//! ```

/// Memory the window and the retransmit buffer of one link may take unless
/// configured otherwise: 256 MiB.
pub const DEFAULT_WINDOW_MEMORY: usize = 256 << 20;

/// Smallest window derived for few frames in flight (room for a re-sent or
/// late frame without any cost worth counting at small frame sizes).
pub const MIN_WINDOW: u16 = 16;

/// Most frames in a window or a retransmit buffer.
pub const MAX_FRAMES: usize = 1024;

/// The sizes of one link, in frames (powers of two), and the memory they
/// may take at most.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Windows {
    /// Frames in assembly at once.
    pub window: u16,
    /// Frames kept to answer NACKs.
    pub keep_frames: usize,
    /// Bytes the side slots of the window and the kept frames take at most
    /// (each holds a frame of at most the largest length).
    pub memory: usize,
}

/// Which of the two sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// The receive window.
    Window,
    /// The frames kept for NACKs.
    KeepFrames,
}

impl std::fmt::Display for Part {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Window => "a window",
            Self::KeepFrames => "a retransmit buffer",
        })
    }
}

/// A window or retransmit buffer that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WindowError {
    /// Fewer frames than the ring keeps in flight.
    #[error(
        "{what} of {value} frames is fewer than the {inflight} in flight need ({floor}): frames beyond it \
         are dropped and fetched again one at a time; set at least {floor}, or leave it unset to derive it"
    )]
    TooSmall {
        /// Which size.
        what: Part,
        /// What was asked for.
        value: usize,
        /// Frames in flight.
        inflight: usize,
        /// The least that works.
        floor: usize,
    },
    /// More frames than a link holds.
    #[error("{what} of {value} frames: at most {MAX_FRAMES}")]
    TooLarge {
        /// Which size.
        what: Part,
        /// What was asked for.
        value: usize,
    },
    /// The sizes take more memory than allowed.
    #[error(
        "a window of {window} frames and {keep_frames} frames kept for NACKs, of up to {frame_len} bytes \
         each, take up to {} MiB, above the limit of {} MiB per link: lower the frames in flight, the \
         frame size, the window or the frames kept, or raise the limit",
        memory.div_ceil(1 << 20),
        cap >> 20
    )]
    OverMemory {
        /// Window, frames.
        window: usize,
        /// Frames kept.
        keep_frames: usize,
        /// Largest frame.
        frame_len: usize,
        /// What they would take.
        memory: usize,
        /// The limit.
        cap: usize,
    },
}

/// The least window and retransmit buffer for `inflight` frames in flight:
/// every one of them plus one (a frame sent again, or a late one).
pub fn floor(inflight: usize) -> usize {
    (inflight.max(1) + 1).next_power_of_two()
}

/// Bytes a window of `window` frames and `keep_frames` kept frames of up to
/// `frame_len` bytes take at most.
pub fn memory(window: usize, keep_frames: usize, frame_len: usize) -> usize {
    window.saturating_add(keep_frames).saturating_mul(frame_len)
}

impl Windows {
    /// The sizes for `inflight` frames of up to `max_frame_len` bytes in
    /// flight. `window` and `keep_frames` of 0 are derived: a window of
    /// every frame in flight plus a quarter (at least [`MIN_WINDOW`]), and
    /// twice the window kept for NACKs; derived sizes shrink, down to
    /// [`floor`], to fit `memory_cap` bytes. Sizes asked for are rounded up
    /// to a power of two, and never shrunk.
    ///
    /// # Errors
    ///
    /// [`WindowError`] when a size asked for is below [`floor`] or above
    /// [`MAX_FRAMES`], or when even the least sizes exceed `memory_cap`.
    pub fn new(
        inflight: usize,
        max_frame_len: usize,
        window: u16,
        keep_frames: usize,
        memory_cap: usize,
    ) -> Result<Self, WindowError> {
        let inflight = inflight.max(1);
        let least = floor(inflight);
        let frame_len = max_frame_len.max(1);
        let asked = |what, value: usize| {
            if value > MAX_FRAMES {
                Err(WindowError::TooLarge { what, value })
            } else if value < least {
                Err(WindowError::TooSmall { what, value, inflight, floor: least })
            } else {
                Ok(value.next_power_of_two())
            }
        };
        let fixed_w = (window != 0).then(|| asked(Part::Window, usize::from(window))).transpose()?;
        let fixed_k = (keep_frames != 0).then(|| asked(Part::KeepFrames, keep_frames)).transpose()?;
        let derived_w = (inflight + inflight / 4).next_power_of_two().clamp(usize::from(MIN_WINDOW), MAX_FRAMES);
        let mut w = fixed_w.unwrap_or(derived_w).max(least);
        let mut k = fixed_k.unwrap_or((2 * w).min(MAX_FRAMES));
        // Shrink what was derived: first the spare frames kept, then both.
        while memory(w, k, frame_len) > memory_cap {
            if fixed_k.is_none() && k > w.max(least) {
                k /= 2;
            } else if fixed_w.is_none() && w > least {
                w /= 2;
                if fixed_k.is_none() {
                    k = w;
                }
            } else if fixed_k.is_none() && k > least {
                k /= 2;
            } else {
                return Err(WindowError::OverMemory {
                    window: w,
                    keep_frames: k,
                    frame_len,
                    memory: memory(w, k, frame_len),
                    cap: memory_cap,
                });
            }
        }
        Ok(Self { window: w as u16, keep_frames: k, memory: memory(w, k, frame_len) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAP: usize = DEFAULT_WINDOW_MEMORY;

    fn sizes(inflight: usize, len: usize) -> (u16, usize) {
        let w = Windows::new(inflight, len, 0, 0, CAP).unwrap();
        (w.window, w.keep_frames)
    }

    #[test]
    fn derived_sizes_follow_inflight() {
        // Few frames in flight: what a link always had.
        assert_eq!(sizes(1, 16_392), (16, 32));
        assert_eq!(sizes(8, 16_392), (16, 32));
        assert_eq!(sizes(16, 16_392), (32, 64));
        assert_eq!(sizes(48, 16_392), (64, 128));
        assert_eq!(sizes(64, 16_392), (128, 256));
        for inflight in 1..=64 {
            let (w, k) = sizes(inflight, 16_392);
            assert!(usize::from(w) > inflight, "window {w} for {inflight} in flight");
            assert!(k >= 2 * usize::from(w));
            assert!(w.is_power_of_two() && k.is_power_of_two());
        }
    }

    #[test]
    fn derived_sizes_shrink_to_the_memory_cap_but_not_below_the_floor() {
        // 1 MiB frames, 64 in flight: 128 + 256 frames would be 384 MiB.
        let w = Windows::new(64, 1 << 20, 0, 0, CAP).unwrap();
        assert_eq!((w.window, w.keep_frames), (128, 128));
        assert_eq!(w.memory, 256 << 20);
        // 64 MiB frames, one in flight: 2 + 2 frames, exactly the cap.
        let w = Windows::new(1, 64 << 20, 0, 0, CAP).unwrap();
        assert_eq!((w.window, w.keep_frames), (2, 2));
        // Three in flight need 4 + 4 of them: refused, naming the fix.
        let e = Windows::new(3, 64 << 20, 0, 0, CAP).unwrap_err();
        assert!(matches!(e, WindowError::OverMemory { window: 4, keep_frames: 4, .. }), "{e:?}");
        assert!(e.to_string().contains("lower the frames in flight"), "{e}");
        // A higher cap allows them.
        assert_eq!(Windows::new(3, 64 << 20, 0, 0, 1 << 30).unwrap().window, 8);
    }

    #[test]
    fn sizes_asked_for_are_checked_not_shrunk() {
        let w = Windows::new(8, 16_392, 100, 300, CAP).unwrap();
        assert_eq!((w.window, w.keep_frames), (128, 512));
        assert!(matches!(
            Windows::new(48, 16_392, 16, 0, CAP),
            Err(WindowError::TooSmall { value: 16, floor: 64, .. })
        ));
        assert!(matches!(
            Windows::new(48, 16_392, 0, 32, CAP),
            Err(WindowError::TooSmall { value: 32, floor: 64, .. })
        ));
        assert!(matches!(Windows::new(1, 16_392, 2000, 0, CAP), Err(WindowError::TooLarge { .. })));
        // A window asked for stays; the derived buffer shrinks around it.
        let w = Windows::new(4, 1 << 20, 64, 0, CAP).unwrap();
        assert_eq!((w.window, w.keep_frames), (64, 128));
        let w = Windows::new(4, 1 << 20, 128, 0, CAP).unwrap();
        assert_eq!((w.window, w.keep_frames), (128, 128));
        assert!(matches!(Windows::new(4, 1 << 20, 256, 0, CAP), Err(WindowError::OverMemory { .. })));
    }
}
