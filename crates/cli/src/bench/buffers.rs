//! Frames in buffers with room around them, lent to the engine as the
//! live dataplane lends received frames (`InBuffer`): a frame may grow,
//! move its start later or earlier where it lies, and the bench sees it
//! as it leaves.

use natrix_engine::InBuffer;

/// `count` buffers of `N` bytes, each holding one frame at a span of it.
pub(super) struct Buffers<const N: usize> {
    bytes: Vec<[u8; N]>,
    /// Each frame's start and length in its buffer.
    spans: Vec<(usize, usize)>,
}

impl<const N: usize> Buffers<N> {
    pub fn new(count: usize) -> Self {
        Buffers { bytes: vec![[0; N]; count], spans: vec![(0, 0); count] }
    }

    /// Buffer `i`'s new frame: `len` bytes from `start`, to be written.
    pub fn fresh(&mut self, i: usize, start: usize, len: usize) -> &mut [u8] {
        self.spans[i] = (start, len);
        &mut self.bytes[i][start..start + len]
    }

    /// Frame `i` as the engine left it.
    pub fn frame(&self, i: usize) -> &[u8] {
        let (start, len) = self.spans[i];
        &self.bytes[i][start..start + len]
    }

    /// Lends the first `n` frames to `f` (which hands them to the engine)
    /// and keeps where each one then lies.
    pub fn lend(&mut self, n: usize, f: impl FnOnce(&mut [InBuffer])) {
        let mut lent: Vec<InBuffer> = self.bytes.iter_mut().zip(&self.spans).take(n).map(|(b, &(start, len))| InBuffer::new(b, start, len)).collect();
        f(&mut lent);
        for (span, b) in self.spans.iter_mut().zip(&lent) {
            *span = (b.start(), b.len());
        }
    }
}
