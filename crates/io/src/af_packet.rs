//! AF_PACKET backend: a TPACKET_V3 receive ring (the kernel fills whole
//! blocks of frames; one poll wakes us for many) and batched transmit with
//! one sendmmsg() per batch, which reads the frames where they lie
//! (`send_from`: the dataplane's held frames, with no copy in natrix) or
//! from the port's own queue (`send`: a copy). It works on every Linux
//! interface, which makes it the fallback when AF_XDP is refused.
//!
//! The kernel hands a packet socket what GRO or LRO merged as one frame,
//! too long to forward, so the port turns both off while it is open
//! (`merging`).
//!
//! The kernel still sees every frame natrix receives this way: natrix's
//! interfaces must carry no kernel IP address and the namespace must not
//! forward, or the kernel answers for natrix (ARP, RST, ICMP).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{fence, Ordering};

use natrix_wire::partial_checksum;

use crate::iface::Interface;
use crate::merging::{Merging, MergingOff};
use crate::port::{IoError, PacketPort, MAX_FRAME};

const BLOCK_SIZE: usize = 1 << 18;
const BLOCK_COUNT: usize = 16;
const RING_FRAME_SIZE: usize = 2048;
/// A partly filled block is handed over after this many milliseconds, which
/// bounds the latency a quiet link adds.
const BLOCK_TIMEOUT_MS: u32 = 1;
const TX_QUEUE: usize = 256;

pub struct AfPacketPort {
    /// GRO and LRO off while the port is open (`merging`).
    merging: MergingOff,
    fd: OwnedFd,
    name: String,
    ring: *mut u8,
    block: usize,
    /// Frames left to hand over in the current block, and where the next is.
    left_in_block: u32,
    next_offset: usize,
    tx_buf: Box<[[u8; MAX_FRAME]]>,
    tx_len: Vec<usize>,
    /// One sendmmsg's frames and messages, kept between calls so that
    /// sending allocates nothing.
    iov: Vec<libc::iovec>,
    msgs: Vec<libc::mmsghdr>,
    /// VLAN-tagged frames, frames longer than natrix's buffers, and
    /// partial checksums natrix does not finish.
    refused: u64,
    /// Frames a sender left with a partial checksum (offload on its
    /// interface), finished before natrix read them.
    checksums_completed: u64,
    kernel_drops: u64,
    tx_errors: u64,
    sendmmsg_calls: u64,
}

// SAFETY: the ring mapping is owned by this port alone and only touched
// through &mut self.
unsafe impl Send for AfPacketPort {}

impl AfPacketPort {
    pub fn open(iface: &Interface) -> Result<AfPacketPort, IoError> {
        let name = iface.name.as_str();
        let proto = (libc::ETH_P_ALL as u16).to_be();
        // SAFETY: plain socket creation.
        // Protocol 0 receives nothing until bind() names the interface and
        // the protocol, so no frame of another interface lands in the ring.
        let raw = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK, 0) };
        if raw < 0 {
            return Err(IoError::os("opening an AF_PACKET socket", name));
        }
        // SAFETY: raw is a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        set_int(&fd, libc::PACKET_VERSION, libc::tpacket_versions::TPACKET_V3 as i32, "selecting TPACKET_V3", name)?;
        // Frames natrix itself sends must not come back as received ones.
        set_int(&fd, libc::PACKET_IGNORE_OUTGOING, 1, "setting PACKET_IGNORE_OUTGOING", name)?;
        // Best effort: skipping the qdisc saves a lock per frame where allowed.
        let _ = set_int(&fd, libc::PACKET_QDISC_BYPASS, 1, "setting PACKET_QDISC_BYPASS", name);
        let ring = map_rx_ring(&fd, name)?;
        // Before any frame reaches the ring: merged ones are too long.
        let merging = MergingOff::apply(name, iface.index);
        bind(&fd, iface.index, proto, name)?;
        Ok(AfPacketPort {
            merging,
            fd,
            name: name.to_owned(),
            ring,
            block: 0,
            left_in_block: 0,
            next_offset: 0,
            tx_buf: vec![[0u8; MAX_FRAME]; TX_QUEUE].into_boxed_slice(),
            tx_len: Vec::with_capacity(TX_QUEUE),
            iov: Vec::with_capacity(TX_QUEUE),
            msgs: Vec::with_capacity(TX_QUEUE),
            refused: 0,
            checksums_completed: 0,
            kernel_drops: 0,
            tx_errors: 0,
            sendmmsg_calls: 0,
        })
    }

    /// What became of the interface's receive merging (GRO, LRO) at open.
    pub fn receive_merging(&self) -> &Merging {
        self.merging.outcome()
    }

    /// Sends the frames `self.iov` points at and empties it.
    fn send_iov(&mut self) -> Result<(), IoError> {
        let mut iov = std::mem::take(&mut self.iov);
        let sent = self.send_messages(&iov);
        iov.clear();
        self.iov = iov;
        sent
    }

    /// Sends the frames `iov` points at, in order, `TX_QUEUE` to a
    /// sendmmsg. A frame the device or the kernel refuses (a full queue,
    /// a frame it will not send) is lost, as on a real link, and counted;
    /// a device that is gone loses the rest.
    fn send_messages(&mut self, iov: &[libc::iovec]) -> Result<(), IoError> {
        let mut done = 0;
        while done < iov.len() {
            let batch = &iov[done..iov.len().min(done + TX_QUEUE)];
            self.msgs.clear();
            self.msgs.extend(batch.iter().map(|v| {
                // SAFETY: msghdr is plain data; zero is a valid empty header.
                let mut hdr: libc::msghdr = unsafe { std::mem::zeroed() };
                hdr.msg_iov = std::ptr::from_ref(v).cast_mut();
                hdr.msg_iovlen = 1;
                libc::mmsghdr { msg_hdr: hdr, msg_len: 0 }
            }));
            self.sendmmsg_calls += 1;
            // SAFETY: msgs point at iovecs in `iov`, which point at frames
            // alive for the call; sendmmsg writes only msg_len.
            let sent = unsafe { libc::sendmmsg(self.fd.as_raw_fd(), self.msgs.as_mut_ptr(), self.msgs.len() as u32, libc::MSG_DONTWAIT) };
            if sent <= 0 {
                let err = std::io::Error::last_os_error();
                if !device_gone(&err) {
                    self.tx_errors += 1;
                    done += 1;
                    continue;
                }
                self.tx_errors += (iov.len() - done) as u64;
                return Err(IoError::Os { op: "sending frames", interface: self.name.clone(), source: err });
            }
            done += sent as usize;
        }
        Ok(())
    }

    fn block_desc(&self, block: usize) -> *mut libc::tpacket_block_desc {
        // SAFETY: block < BLOCK_COUNT, inside the mapping.
        unsafe { self.ring.add(block * BLOCK_SIZE).cast() }
    }

    /// Whether the kernel has handed the current block to us; if so, starts
    /// walking it when we have not yet.
    fn current_block_ready(&mut self) -> bool {
        if self.left_in_block > 0 {
            return true;
        }
        let desc = self.block_desc(self.block);
        // SAFETY: desc points at a block descriptor inside the ring; the
        // status word is shared with the kernel, hence the volatile read.
        let status = unsafe { std::ptr::read_volatile(std::ptr::addr_of!((*desc).hdr.bh1.block_status)) };
        if status & libc::TP_STATUS_USER == 0 {
            return false;
        }
        fence(Ordering::Acquire);
        // SAFETY: the block is ours until we give it back.
        let (count, first) = unsafe { ((*desc).hdr.bh1.num_pkts, (*desc).hdr.bh1.offset_to_first_pkt) };
        if count == 0 {
            self.release_block();
            return false;
        }
        self.left_in_block = count;
        self.next_offset = first as usize;
        true
    }

    fn release_block(&mut self) {
        let desc = self.block_desc(self.block);
        fence(Ordering::Release);
        // SAFETY: hands the block back to the kernel (TP_STATUS_KERNEL = 0).
        unsafe { std::ptr::write_volatile(std::ptr::addr_of_mut!((*desc).hdr.bh1.block_status), libc::TP_STATUS_KERNEL) };
        self.block = (self.block + 1) % BLOCK_COUNT;
        self.left_in_block = 0;
    }
}

impl PacketPort for AfPacketPort {
    fn recv_batch(&mut self, max: usize, f: &mut dyn FnMut(&mut [u8])) -> Result<usize, IoError> {
        let mut n = 0;
        while n < max && self.current_block_ready() {
            // SAFETY: next_offset comes from the kernel's layout of this block.
            let base = unsafe { self.ring.add(self.block * BLOCK_SIZE + self.next_offset) };
            let hdr = base.cast::<libc::tpacket3_hdr>();
            // SAFETY: hdr is a tpacket3_hdr written by the kernel inside the block.
            let (next, status, mac, snaplen, wire_len) = unsafe { ((*hdr).tp_next_offset, (*hdr).tp_status, (*hdr).tp_mac, (*hdr).tp_snaplen, (*hdr).tp_len) };
            // A VLAN tag the kernel took off the frame: natrix's live
            // interfaces carry untagged traffic, and translating a tagged
            // frame as untagged would leak it between VLANs.
            // A frame longer than natrix's buffers (the MTU raised after
            // start): refused whole rather than translated cut short.
            if status & libc::TP_STATUS_VLAN_VALID != 0 || wire_len as usize > MAX_FRAME {
                self.refused += 1;
            } else if is_incoming(hdr) {
                let len = snaplen as usize;
                debug_assert!(len <= MAX_FRAME, "the ring copies whole frames of up to MAX_FRAME bytes");
                // SAFETY: the frame lies at tp_mac within the block, snaplen bytes long.
                let frame = unsafe { std::slice::from_raw_parts_mut(base.add(usize::from(mac)), len) };
                // A checksum the sender's offload left partial (a veth
                // peer's), as the kernel says here: finished where natrix
                // finds it (see `partial_checksum`), refused where not (one
                // behind another extension header or inside another tunnel).
                let partial = status & libc::TP_STATUS_CSUMNOTREADY != 0;
                if partial && !partial_checksum::complete(frame) {
                    self.refused += 1;
                } else {
                    self.checksums_completed += u64::from(partial);
                    f(frame);
                    n += 1;
                }
            }
            self.left_in_block -= 1;
            self.next_offset += next as usize;
            if self.left_in_block == 0 {
                self.release_block();
            }
        }
        Ok(n)
    }

    fn send(&mut self, frame: &[u8]) -> bool {
        if frame.len() > MAX_FRAME {
            return false;
        }
        if self.tx_len.len() == TX_QUEUE && self.flush().is_err() {
            return false;
        }
        let i = self.tx_len.len();
        self.tx_buf[i][..frame.len()].copy_from_slice(frame);
        self.tx_len.push(frame.len());
        true
    }

    fn flush(&mut self) -> Result<(), IoError> {
        let AfPacketPort { iov, tx_buf, tx_len, .. } = self;
        iov.extend(tx_buf.iter_mut().zip(tx_len.iter()).map(|(buf, &len)| libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: len }));
        tx_len.clear();
        self.send_iov()
    }

    fn send_from(&mut self, frames: &[&[u8]]) -> Result<(), IoError> {
        let queued = self.flush();
        // sendmmsg only reads through these pointers.
        self.iov.extend(frames.iter().map(|f| libc::iovec { iov_base: f.as_ptr().cast_mut().cast(), iov_len: f.len() }));
        queued.and(self.send_iov())
    }

    fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    fn backend(&self) -> &'static str {
        "af_packet"
    }

    fn dropped_on_receive(&self) -> u64 {
        self.refused
    }

    fn checksums_completed(&self) -> u64 {
        self.checksums_completed
    }

    fn kernel_dropped(&mut self) -> u64 {
        // SAFETY: tpacket_stats_v3 is plain data; the kernel fills it.
        let mut st: libc::tpacket_stats_v3 = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::tpacket_stats_v3>() as libc::socklen_t;
        // SAFETY: st and len are live and sized for the call.
        let rc = unsafe { libc::getsockopt(self.fd.as_raw_fd(), libc::SOL_PACKET, libc::PACKET_STATISTICS, std::ptr::addr_of_mut!(st).cast(), &mut len) };
        if rc == 0 {
            // The kernel resets its counters on every read.
            self.kernel_drops += u64::from(st.tp_drops);
        }
        self.kernel_drops
    }

    fn dropped_on_transmit(&self) -> u64 {
        self.tx_errors
    }

    fn transmit_calls(&self) -> u64 {
        self.sendmmsg_calls
    }
}

impl Drop for AfPacketPort {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what map_rx_ring mapped.
        unsafe { libc::munmap(self.ring.cast(), BLOCK_SIZE * BLOCK_COUNT) };
    }
}

/// The kernel stores the link-layer address right after the aligned header;
/// its packet type tells outgoing frames apart where PACKET_IGNORE_OUTGOING
/// is missing.
fn is_incoming(hdr: *const libc::tpacket3_hdr) -> bool {
    let sll_at = (std::mem::size_of::<libc::tpacket3_hdr>() + 15) & !15;
    // SAFETY: TPACKET_V3 places a sockaddr_ll at this offset in every frame slot.
    let sll = unsafe { &*(hdr.cast::<u8>().add(sll_at).cast::<libc::sockaddr_ll>()) };
    sll.sll_pkttype != libc::PACKET_OUTGOING
}

/// Errors after which no frame would leave: the interface went away or
/// down, or the socket broke.
fn device_gone(err: &std::io::Error) -> bool {
    matches!(err.raw_os_error(), Some(libc::ENXIO | libc::ENODEV | libc::ENETDOWN | libc::EBADF | libc::ENOTSOCK))
}

fn set_int(fd: &OwnedFd, opt: libc::c_int, value: libc::c_int, op: &'static str, name: &str) -> Result<(), IoError> {
    // SAFETY: value lives for the call; its size is passed.
    let rc = unsafe { libc::setsockopt(fd.as_raw_fd(), libc::SOL_PACKET, opt, std::ptr::addr_of!(value).cast(), std::mem::size_of::<libc::c_int>() as u32) };
    if rc < 0 {
        return Err(IoError::os(op, name));
    }
    Ok(())
}

fn map_rx_ring(fd: &OwnedFd, name: &str) -> Result<*mut u8, IoError> {
    let req = libc::tpacket_req3 {
        tp_block_size: BLOCK_SIZE as u32,
        tp_block_nr: BLOCK_COUNT as u32,
        tp_frame_size: RING_FRAME_SIZE as u32,
        tp_frame_nr: (BLOCK_SIZE * BLOCK_COUNT / RING_FRAME_SIZE) as u32,
        tp_retire_blk_tov: BLOCK_TIMEOUT_MS,
        tp_sizeof_priv: 0,
        tp_feature_req_word: 0,
    };
    // SAFETY: req lives for the call; its size is passed.
    let rc = unsafe { libc::setsockopt(fd.as_raw_fd(), libc::SOL_PACKET, libc::PACKET_RX_RING, std::ptr::addr_of!(req).cast(), std::mem::size_of::<libc::tpacket_req3>() as u32) };
    if rc < 0 {
        return Err(IoError::os("creating the receive ring", name));
    }
    // SAFETY: maps the ring the kernel just created for this socket.
    let ring = unsafe { libc::mmap(std::ptr::null_mut(), BLOCK_SIZE * BLOCK_COUNT, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED | libc::MAP_LOCKED, fd.as_raw_fd(), 0) };
    if ring == libc::MAP_FAILED {
        return Err(IoError::os("mapping the receive ring", name));
    }
    Ok(ring.cast())
}

fn bind(fd: &OwnedFd, index: u32, proto_be: u16, name: &str) -> Result<(), IoError> {
    // SAFETY: sockaddr_ll is plain data.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = proto_be;
    sll.sll_ifindex = index as i32;
    // SAFETY: sll lives for the call; its size is passed.
    let rc = unsafe { libc::bind(fd.as_raw_fd(), std::ptr::addr_of!(sll).cast(), std::mem::size_of::<libc::sockaddr_ll>() as u32) };
    if rc < 0 {
        return Err(IoError::os("binding to the interface", name));
    }
    Ok(())
}
