//! The ublk device parameters a target's capabilities turn into: sizes,
//! cache attributes (a volatile cache, so the kernel sends FLUSH; FUA per
//! write), and the DISCARD and WRITE_ZEROES limits.

/// Sectors are 512 bytes on every ublk device casblk makes.
pub const SECTOR_SHIFT: u32 = 9;
pub const SECTOR_BYTES: u64 = 1 << SECTOR_SHIFT;

/// Device parameters for a device of `size` bytes taking requests of at
/// most `io_buf_bytes` (`read_only`: the kernel refuses writes).
pub fn device_params(
    size: u64,
    io_buf_bytes: u32,
    discard: bool,
    read_only: bool,
) -> libublk::sys::ublk_params {
    let max_sectors = io_buf_bytes >> SECTOR_SHIFT;
    let read_only = if read_only { libublk::sys::UBLK_ATTR_READ_ONLY } else { 0 };
    libublk::sys::ublk_params {
        types: libublk::sys::UBLK_PARAM_TYPE_BASIC | libublk::sys::UBLK_PARAM_TYPE_DISCARD,
        basic: libublk::sys::ublk_param_basic {
            // A volatile cache makes the kernel send FLUSH; FUA is honoured per write.
            attrs: libublk::sys::UBLK_ATTR_VOLATILE_CACHE | libublk::sys::UBLK_ATTR_FUA | read_only,
            logical_bs_shift: 9,
            physical_bs_shift: 12,
            io_opt_shift: 12,
            io_min_shift: 9,
            max_sectors,
            dev_sectors: size >> SECTOR_SHIFT,
            ..Default::default()
        },
        discard: libublk::sys::ublk_param_discard {
            discard_alignment: 0,
            discard_granularity: 4096,
            max_discard_sectors: if discard { u32::MAX >> SECTOR_SHIFT } else { 0 },
            max_write_zeroes_sectors: max_sectors,
            max_discard_segments: 1,
            ..Default::default()
        },
        ..Default::default()
    }
}
