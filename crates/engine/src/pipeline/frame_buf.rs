//! Frames as I/O backends lend them: in a buffer that may have room after
//! the frame's end (an AF_XDP chunk, a buffer of a pool), so a function
//! that makes a frame longer (HOST_ID's options) writes it where it lies
//! instead of into a copy; and whose start can move, so a packet taken out
//! of a tunnel (a DS-Lite softwire) leaves from where it lies, and one put
//! into a tunnel gets its new headers in the room before it.

/// A frame handed to `Engine::process_batch`, in its buffer.
pub trait FrameBuf {
    /// The frame.
    fn frame(&mut self) -> &mut [u8];

    /// Makes the frame `len` bytes long within its buffer and returns it;
    /// bytes past its old end have no particular content. None, with the
    /// frame unchanged, when the buffer has no room for `len` bytes.
    fn set_frame_len(&mut self, len: usize) -> Option<&mut [u8]>;

    /// The frame followed by the room its buffer has after it (bytes of
    /// no particular content), and the frame's length: what a function
    /// may grow the frame into where it lies, before `set_frame_len` says
    /// how long it came out. The first `len` bytes are `frame()`, and
    /// `set_frame_len` must then accept any length up to the slice's. By
    /// default no room: the frame grows, if its buffer lets it, through
    /// `set_frame_len` alone.
    fn with_room(&mut self) -> (&mut [u8], usize) {
        let frame = self.frame();
        let len = frame.len();
        (frame, len)
    }

    /// Whether `narrow` can move the frame's start: not for a buffer whose
    /// owner learns only a verdict (a bare slice) or whose start is fixed
    /// (an array). The engine then copies what it would narrow the frame
    /// to into a frame of its own, and leaves this one as it arrived.
    const NARROWS: bool = false;

    /// Makes the frame the `len` bytes at `start` of itself, where they
    /// lie (only called where `NARROWS`).
    fn narrow(&mut self, _start: usize, _len: usize) {}

    /// Whether `widen_front` can ever succeed: not for a bare slice or an
    /// array, for which the engine then spares itself the preparations.
    const WIDENS: bool = false;

    /// Moves the frame's start `by` bytes earlier, into the room its buffer
    /// has before it, and returns the longer frame (the first `by` bytes of
    /// no particular content); None, with the frame unchanged, without room.
    fn widen_front(&mut self, _by: usize) -> Option<&mut [u8]> {
        None
    }
}

/// A frame in a slice of exactly its length: no room to grow.
impl FrameBuf for &mut [u8] {
    fn frame(&mut self) -> &mut [u8] {
        self
    }

    fn set_frame_len(&mut self, len: usize) -> Option<&mut [u8]> {
        let taken = std::mem::take(self);
        if len > taken.len() {
            *self = taken;
            return None;
        }
        *self = &mut taken[..len];
        Some(self)
    }
}

/// A frame filling an array: its length is fixed, so a frame that must
/// grow is copied.
impl<const N: usize> FrameBuf for [u8; N] {
    fn frame(&mut self) -> &mut [u8] {
        self
    }

    fn set_frame_len(&mut self, len: usize) -> Option<&mut [u8]> {
        (len == N).then_some(self)
    }
}

/// A frame in a vector grows within its capacity, or reallocates.
impl FrameBuf for Vec<u8> {
    fn frame(&mut self) -> &mut [u8] {
        self
    }

    fn set_frame_len(&mut self, len: usize) -> Option<&mut [u8]> {
        self.resize(len, 0);
        Some(self)
    }

    const NARROWS: bool = true;

    fn narrow(&mut self, start: usize, len: usize) {
        let end = (start + len).min(self.len());
        self.truncate(end);
        self.drain(..start.min(end));
    }

    const WIDENS: bool = true;

    /// A vector makes room in front by moving its bytes.
    fn widen_front(&mut self, by: usize) -> Option<&mut [u8]> {
        self.splice(..0, std::iter::repeat_n(0, by));
        Some(self)
    }
}

/// A frame in a larger buffer, with room before and after it: how the live
/// dataplane lends a received frame.
pub struct InBuffer<'a> {
    buf: &'a mut [u8],
    start: usize,
    len: usize,
}

impl<'a> InBuffer<'a> {
    /// The frame `buf[start..start + len]`, cut to the buffer.
    pub fn new(buf: &'a mut [u8], start: usize, len: usize) -> Self {
        let start = start.min(buf.len());
        let len = len.min(buf.len() - start);
        InBuffer { buf, start, len }
    }

    /// Where the frame starts now, from the buffer's start.
    pub fn start(&self) -> usize {
        self.start
    }

    /// The frame's length now.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl FrameBuf for InBuffer<'_> {
    fn frame(&mut self) -> &mut [u8] {
        &mut self.buf[self.start..self.start + self.len]
    }

    fn set_frame_len(&mut self, len: usize) -> Option<&mut [u8]> {
        let frame = self.buf.get_mut(self.start..self.start + len)?;
        self.len = len;
        Some(frame)
    }

    fn with_room(&mut self) -> (&mut [u8], usize) {
        (&mut self.buf[self.start..], self.len)
    }

    const NARROWS: bool = true;

    fn narrow(&mut self, start: usize, len: usize) {
        let start = start.min(self.len);
        self.start += start;
        self.len = len.min(self.len - start);
    }

    const WIDENS: bool = true;

    fn widen_front(&mut self, by: usize) -> Option<&mut [u8]> {
        let start = self.start.checked_sub(by)?;
        (self.start, self.len) = (start, self.len + by);
        Some(&mut self.buf[start..start + self.len])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_grows_only_into_room_its_buffer_has() {
        let mut buf = [7u8; 8];
        let mut f = InBuffer::new(&mut buf, 0, 5);
        assert_eq!(f.frame(), &[7; 5]);
        assert_eq!(f.with_room().0.len(), 8, "the rest of the buffer lent as room");
        assert_eq!(f.with_room().1, 5);
        assert!(f.set_frame_len(9).is_none());
        assert_eq!(f.len(), 5);
        assert_eq!(f.set_frame_len(8).map(|b| b.len()), Some(8));
        assert_eq!(f.set_frame_len(6).map(|b| b.len()), Some(6));
        assert_eq!(f.frame().len(), 6);

        let mut exact = [0u8; 4];
        let mut s: &mut [u8] = &mut exact;
        assert_eq!(s.with_room().0.len(), 4, "a bare slice has no room");
        assert!(s.set_frame_len(5).is_none());
        assert_eq!(s.set_frame_len(3).map(|b| b.len()), Some(3));
        assert_eq!(s.frame().len(), 3);

        let mut v = vec![1u8; 3];
        assert_eq!(v.set_frame_len(6).map(|b| b.to_vec()), Some(vec![1, 1, 1, 0, 0, 0]));
        v.narrow(1, 3);
        assert_eq!(v, [1, 1, 0]);
    }

    #[test]
    fn a_frame_narrowed_in_its_buffer_starts_later_and_grows_from_there() {
        let mut buf: Vec<u8> = (0..16).collect();
        let mut f = InBuffer::new(&mut buf, 0, 10);
        assert!(f.widen_front(1).is_none(), "no room before the buffer's start");
        f.narrow(4, 5);
        assert_eq!((f.start(), f.len()), (4, 5));
        assert_eq!(f.frame(), &[4, 5, 6, 7, 8]);
        assert_eq!(f.set_frame_len(12).map(|b| b.len()), Some(12));
        assert!(f.set_frame_len(13).is_none(), "the buffer ends 12 bytes after the new start");
        assert_eq!(f.widen_front(3).map(|b| b.len()), Some(15));
        assert_eq!((f.start(), f.len()), (1, 15));
        assert_eq!(f.frame()[..3], [1, 2, 3]);
        let mut v = vec![7u8; 2];
        assert_eq!(v.widen_front(2).map(|b| b.to_vec()), Some(vec![0, 0, 7, 7]));
        const { assert!(!<[u8; 4] as FrameBuf>::NARROWS && !<&mut [u8] as FrameBuf>::NARROWS) };
    }
}
