//! Frames as I/O backends lend them: in a buffer that may have room after
//! the frame's end (an AF_XDP chunk, a buffer of a pool), so a function
//! that makes a frame longer (HOST_ID's options) writes it where it lies
//! instead of into a copy.

/// A frame handed to `Engine::process_batch`, in its buffer.
pub trait FrameBuf {
    /// The frame.
    fn frame(&mut self) -> &mut [u8];

    /// Makes the frame `len` bytes long within its buffer and returns it;
    /// bytes past its old end have no particular content. None, with the
    /// frame unchanged, when the buffer has no room for `len` bytes.
    fn set_frame_len(&mut self, len: usize) -> Option<&mut [u8]>;
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
}

/// A frame at the start of a larger buffer, the rest of it room to grow
/// into: how the live dataplane lends a received frame.
pub struct InBuffer<'a> {
    buf: &'a mut [u8],
    len: usize,
}

impl<'a> InBuffer<'a> {
    /// The frame `buf[..len]`; `len` is cut to the buffer's length.
    pub fn new(buf: &'a mut [u8], len: usize) -> Self {
        let len = len.min(buf.len());
        InBuffer { buf, len }
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
        &mut self.buf[..self.len]
    }

    fn set_frame_len(&mut self, len: usize) -> Option<&mut [u8]> {
        let frame = self.buf.get_mut(..len)?;
        self.len = len;
        Some(frame)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_grows_only_into_room_its_buffer_has() {
        let mut buf = [7u8; 8];
        let mut f = InBuffer::new(&mut buf, 5);
        assert_eq!(f.frame(), &[7; 5]);
        assert!(f.set_frame_len(9).is_none());
        assert_eq!(f.len(), 5);
        assert_eq!(f.set_frame_len(8).map(|b| b.len()), Some(8));
        assert_eq!(f.set_frame_len(6).map(|b| b.len()), Some(6));
        assert_eq!(f.frame().len(), 6);

        let mut exact = [0u8; 4];
        let mut s: &mut [u8] = &mut exact;
        assert!(s.set_frame_len(5).is_none());
        assert_eq!(s.set_frame_len(3).map(|b| b.len()), Some(3));
        assert_eq!(s.frame().len(), 3);

        let mut v = vec![1u8; 3];
        assert_eq!(v.set_frame_len(6).map(|b| b.to_vec()), Some(vec![1, 1, 1, 0, 0, 0]));
    }
}
