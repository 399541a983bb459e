//! The lock's module data type: what a lock key holds, and the callbacks
//! Redis calls to save, load, rewrite, copy, digest, size and free it.
//!
//! A value is one allocation. An exclusive hold is the numbers of the hold
//! (count, fence, lease end, start) and its owner: in 32 bytes when the
//! owner is of a usual form (`<uuid>:<thread>`, `<hex>:<n>`: see
//! `redislock_core::owner`) and the numbers are the usual ones, else a
//! header and the owner, packed or as it came. Redis adds its own bytes
//! per key around it (the key's name and table entries, the object and its
//! module-value wrapper); this value is the part the module decides. The lease end is stored here and
//! mirrored as the key's TTL (see `ffi::key`); the stored one is the truth
//! when the two disagree (no lock lives forever).

use std::alloc::{self, Layout};
use std::ffi::CString;
use std::ops::Deref;
use std::os::raw::{c_int, c_void};
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use redis_module::{logging, native_types::RedisType, raw, RedisString};

use crate::ffi::lease_clock::{self, from_wall, to_wall};
use crate::ffi::{expired_held, guard, latency, lock_may_exist, lock_names, now_ms};
use redislock_core::args::MAX_OWNER_LEN;
use redislock_core::holds::{Holder, Holds, Mode};
use redislock_core::limits::MAX_COUNT;
use redislock_core::lock::Hold;
use redislock_core::owner::{Packed, Suffix, Text, MAX_ENCODED};
use redislock_core::{fence, stats};

/// The RDB encoding of a lock value. Version history (every one must stay
/// loadable: see [`rdb_load`]; `tests/fixtures/v1-locks.rdb` is a version 1
/// file, `tests/fixtures/v3-locks.rdb` a version 3 one):
/// - 1: owner (string buffer), count (unsigned), fence (unsigned). The lease
///   was only the key's TTL.
/// - 2: the same, then the lease end (unsigned, unix ms).
/// - 3: holds of either mode: mode (unsigned: 0 exclusive, 1 shared), limit
///   (unsigned, 0: none), holders (unsigned, at least 1), then per holder,
///   oldest first: owner (string buffer), count, fence, lease end, and the
///   unix ms its hold began (unsigned each).
/// - 4: as 3, and each holder's permits (unsigned) after its start.
pub const ENCODING_VERSION: i32 = 4;

/// A lease end not known: a value loaded from version 1. Its key's TTL is
/// its lease (see [`redislock_core::lock::lease_end`]).
pub const LEASE_UNKNOWN: u64 = 0;

/// Version 1 values loaded since the last upgrade pass (see
/// `events::upgrade_v1_locks`).
pub static V1_LOADED: AtomicU64 = AtomicU64::new(0);

/// Times are kept in 48 bits (unix ms up to the year 10889); a later one
/// is stored as this, which no lease reaches in practice.
const MAX_TIME: u64 = (1 << 48) - 1;

// A value is one of three forms, told by the low two bits of its first byte.
/// An exclusive hold whose owner packs ([`Packed`]) and whose numbers are
/// the usual ones, in 32 bytes (jemalloc's 32-byte class):
///
/// | bytes  | what |
/// |--------|------|
/// | 0      | the form; bit 2: a dashed owner; bit 3: a number after it; bits 4–7: count − 1 |
/// | 1..17  | the owner's 128-bit value |
/// | 17..24 | the fence (below 2^56) |
/// | 24     | since − fence / 2^10, signed: a fence is the clock × 2^10 when the hold began |
/// | 25..29 | lease end − since |
/// | 29..32 | the owner's number (below 2^24), or 0 |
const COMPACT: u8 = 0;
/// Any exclusive hold: a 26-byte header (a u16 of the form, bit 2 set when
/// the owner is packed, and the stored owner's length above bit 3; fence
/// u64, count u32, lease 48 bits, since 48 bits, all little-endian), then
/// the owner as it came or packed.
const WIDE: u8 = 1;
/// A [`SharedLock`]: the header, then the holds.
const SHARED: u8 = 2;

const COMPACT_LEN: usize = 32;
const WIDE_HEAD: usize = 26;
/// The most counts the compact form keeps.
const COMPACT_COUNT: u64 = 16;
/// The most owner numbers the compact form keeps.
const COMPACT_NUMBER: u64 = (1 << 24) - 1;

/// What a lock key's value is. Never built on the stack: the first bytes of
/// one allocation made by [`StoredLock::new_raw`] (the compact or the wide
/// form, each at least this long) or [`StoredLock::new_shared`], seen
/// through references to it; the accessors read the rest of the allocation
/// by its form.
#[repr(C)]
#[derive(Debug)]
pub struct StoredLock {
    head: [u8; WIDE_HEAD],
}

/// A lock held shared (or any lock whose holds are not one exclusive
/// owner's): a header that says so, then the holds.
#[repr(C)]
pub struct SharedLock {
    head: StoredLock,
    pub holds: Holds,
}

/// An exclusive hold's numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Numbers {
    count: u64,
    fence: u64,
    lease: u64,
    since: u64,
}

/// An exclusive value's owner: borrowed from the value, or unpacked.
pub enum OwnerBytes<'a> {
    Stored(&'a [u8]),
    Unpacked(Text),
}

impl Deref for OwnerBytes<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            OwnerBytes::Stored(bytes) => bytes,
            OwnerBytes::Unpacked(text) => text,
        }
    }
}

fn le(bytes: &[u8]) -> u64 {
    let mut full = [0; 8];
    full[..bytes.len()].copy_from_slice(bytes);
    u64::from_le_bytes(full)
}

/// The compact form of an exclusive hold, if its owner and numbers fit it.
fn compact(owner: &Packed, n: Numbers) -> Option<[u8; COMPACT_LEN]> {
    let number = match owner.suffix {
        Suffix::None => None,
        Suffix::Number(k) if k <= COMPACT_NUMBER => Some(k),
        _ => return None,
    };
    if !(1..=COMPACT_COUNT).contains(&n.count) || n.fence >= 1 << 56 {
        return None;
    }
    let since_delta = i8::try_from(n.since as i64 - (n.fence >> 10) as i64).ok()?;
    let lease_delta = u32::try_from(n.lease.checked_sub(n.since)?).ok()?;
    if n.lease == LEASE_UNKNOWN || n.lease > MAX_TIME {
        return None;
    }
    let mut out = [0; COMPACT_LEN];
    out[0] = COMPACT
        | u8::from(owner.dashed) << 2
        | u8::from(number.is_some()) << 3
        | ((n.count - 1) as u8) << 4;
    out[1..17].copy_from_slice(&owner.id);
    out[17..24].copy_from_slice(&n.fence.to_le_bytes()[..7]);
    out[24] = since_delta as u8;
    out[25..29].copy_from_slice(&lease_delta.to_le_bytes());
    out[29..32].copy_from_slice(&number.unwrap_or(0).to_le_bytes()[..3]);
    Some(out)
}

/// The owner and numbers of a compact value's bytes.
fn uncompact(bytes: &[u8; COMPACT_LEN]) -> (Packed, Numbers) {
    let mut id = [0; 16];
    id.copy_from_slice(&bytes[1..17]);
    let owner = Packed {
        id,
        dashed: bytes[0] & 4 != 0,
        suffix: if bytes[0] & 8 != 0 {
            Suffix::Number(le(&bytes[29..32]))
        } else {
            Suffix::None
        },
    };
    let fence = le(&bytes[17..24]);
    let since = ((fence >> 10) as i64 + i64::from(bytes[24] as i8)) as u64;
    let numbers = Numbers {
        count: u64::from(bytes[0] >> 4) + 1,
        fence,
        lease: since + le(&bytes[25..29]),
        since,
    };
    (owner, numbers)
}

/// The wide header of an exclusive hold whose stored owner is `len` bytes
/// (`packed`: encoded by [`Packed::encode`]).
fn wide_head(len: usize, packed: bool, n: Numbers) -> [u8; WIDE_HEAD] {
    let mut out = [0; WIDE_HEAD];
    let tag = u16::from(WIDE) | u16::from(packed) << 2 | (len as u16) << 3;
    out[0..2].copy_from_slice(&tag.to_le_bytes());
    out[2..10].copy_from_slice(&n.fence.to_le_bytes());
    let count = u32::try_from(n.count).unwrap_or(u32::MAX);
    out[10..14].copy_from_slice(&count.to_le_bytes());
    out[14..20].copy_from_slice(&n.lease.min(MAX_TIME).to_le_bytes()[..6]);
    out[20..26].copy_from_slice(&n.since.min(MAX_TIME).to_le_bytes()[..6]);
    out
}

impl StoredLock {
    /// The allocation of a compact or wide value of `size` bytes.
    fn layout(size: usize) -> Option<Layout> {
        Layout::from_size_align(size, std::mem::align_of::<StoredLock>()).ok()
    }

    fn form(&self) -> u8 {
        self.head[0] & 3
    }

    /// The wide form's stored owner length and whether it is packed.
    fn wide_owner(&self) -> (usize, bool) {
        let tag = u16::from_le_bytes([self.head[0], self.head[1]]);
        (usize::from(tag >> 3), tag & 4 != 0)
    }

    /// This value's bytes (compact and wide forms).
    fn bytes(&self) -> &[u8] {
        let len = match self.form() {
            COMPACT => COMPACT_LEN,
            WIDE => WIDE_HEAD + self.wide_owner().0,
            _ => WIDE_HEAD,
        };
        // SAFETY: a compact value is an allocation of `COMPACT_LEN` bytes
        // and a wide one of its header and owner (`new_raw`), alive as long
        // as `self`; a shared one is read no further than its header.
        unsafe { std::slice::from_raw_parts((self as *const StoredLock).cast::<u8>(), len) }
    }

    /// This value's bytes, to change in place (compact and wide forms).
    fn bytes_mut(&mut self) -> &mut [u8] {
        let len = self.bytes().len();
        // SAFETY: as in `bytes`; `&mut self` makes this the only borrow.
        unsafe { std::slice::from_raw_parts_mut((self as *mut StoredLock).cast::<u8>(), len) }
    }

    /// An exclusive value's numbers (`None`: a shared one).
    fn numbers(&self) -> Option<Numbers> {
        match self.form() {
            COMPACT => {
                let bytes: &[u8; COMPACT_LEN] = self.bytes().try_into().ok()?;
                Some(uncompact(bytes).1)
            }
            WIDE => Some(Numbers {
                fence: le(&self.head[2..10]),
                count: le(&self.head[10..14]),
                lease: le(&self.head[14..20]),
                since: le(&self.head[20..26]),
            }),
            _ => None,
        }
    }

    /// Makes an exclusive value for Redis: one allocation, owner inline,
    /// packed when it is of a usual form ([`Packed`]), in 32 bytes when
    /// the numbers fit too. Every lock value is born here or in
    /// [`StoredLock::new_shared`] and dies in [`StoredLock::free_raw`],
    /// which is how `INFO lock` counts `held`. Null if the owner is too
    /// long to store.
    pub fn new_raw(owner: &[u8], count: u64, fence: u64, lease: u64, since: u64) -> *mut c_void {
        let numbers = Numbers {
            count: count.min(u64::from(u32::MAX)),
            fence,
            lease: lease.min(MAX_TIME),
            since: since.min(MAX_TIME),
        };
        let packed = Packed::parse(owner);
        if let Some(bytes) = packed.as_ref().and_then(|p| compact(p, numbers)) {
            return Self::alloc_with(&[&bytes]);
        }
        if owner.len() > MAX_OWNER_LEN {
            return ptr::null_mut();
        }
        let mut encoded = [0; MAX_ENCODED];
        let stored = match packed {
            Some(p) => {
                let len = p.encode(&mut encoded);
                &encoded[..len]
            }
            None => owner,
        };
        let head = wide_head(stored.len(), packed.is_some(), numbers);
        Self::alloc_with(&[&head, stored])
    }

    /// One allocation holding `parts` one after the other: a new value.
    fn alloc_with(parts: &[&[u8]]) -> *mut c_void {
        let size = parts.iter().map(|p| p.len()).sum();
        let Some(layout) = Self::layout(size) else {
            return ptr::null_mut();
        };
        // SAFETY: the layout has a non-zero size (every form has a header)
        // and the parts are copied inside it, one after the other.
        unsafe {
            let value = alloc::alloc(layout);
            if value.is_null() {
                alloc::handle_alloc_error(layout);
            }
            let mut at = 0;
            for part in parts {
                ptr::copy_nonoverlapping(part.as_ptr(), value.add(at), part.len());
                at += part.len();
            }
            born(value.cast())
        }
    }

    /// Makes a shared value for Redis (`holds` has at least one holder).
    pub fn new_shared(holds: Holds) -> *mut c_void {
        stats::SHARED_HELD.add(holds.len() as i64);
        let mut head = [0; WIDE_HEAD];
        head[0] = SHARED;
        let value = Box::new(SharedLock {
            head: StoredLock { head },
            holds,
        });
        born(Box::into_raw(value).cast())
    }

    /// Frees a value Redis refused or no longer needs.
    ///
    /// # Safety
    /// `value` must come from [`StoredLock::new_raw`] or
    /// [`StoredLock::new_shared`] and not be used again.
    pub unsafe fn free_raw(value: *mut c_void) {
        if value.is_null() {
            return;
        }
        stats::HELD.add(-1);
        // SAFETY: the caller's contract; a shared value was made by a
        // `Box`, an exclusive one with the layout of its bytes.
        unsafe {
            let lock = &*value.cast::<StoredLock>();
            if lock.form() == SHARED {
                let shared = Box::from_raw(value.cast::<SharedLock>());
                stats::SHARED_HELD.add(-(shared.holds.len() as i64));
            } else if let Some(layout) = Self::layout(lock.bytes().len()) {
                alloc::dealloc(value.cast(), layout);
            }
        }
    }

    /// The holds of a shared value (`None`: an exclusive one).
    pub fn shared(&self) -> Option<&Holds> {
        if self.form() != SHARED {
            return None;
        }
        // SAFETY: a header with the tag is the head of a `SharedLock`
        // (`repr(C)`, header first), alive as long as `self`.
        Some(unsafe { &(*(self as *const StoredLock).cast::<SharedLock>()).holds })
    }

    /// The holds of a shared value, to change in place (`None`: an
    /// exclusive one).
    pub fn shared_mut(&mut self) -> Option<&mut Holds> {
        if self.form() != SHARED {
            return None;
        }
        // SAFETY: as in `shared`; `&mut self` makes this the only borrow.
        Some(unsafe { &mut (*(self as *mut StoredLock).cast::<SharedLock>()).holds })
    }

    /// Whether `owner` holds this exclusive value: the stored owner,
    /// unpacked on the stack if it is packed, against `owner`, nothing
    /// copied to the heap. False for a shared value.
    pub fn owned_by(&self, owner: &[u8]) -> bool {
        self.form() != SHARED && *self.owner() == *owner
    }

    /// The owner token (empty for a shared value: no owner is empty).
    pub fn owner(&self) -> OwnerBytes<'_> {
        match self.form() {
            COMPACT => match self.bytes().try_into() {
                Ok(bytes) => OwnerBytes::Unpacked(uncompact(bytes).0.text()),
                Err(_) => OwnerBytes::Stored(&[]),
            },
            WIDE => {
                let (_, packed) = self.wide_owner();
                let stored = &self.bytes()[WIDE_HEAD..];
                if !packed {
                    return OwnerBytes::Stored(stored);
                }
                match Packed::decode(stored) {
                    Some(p) => OwnerBytes::Unpacked(p.text()),
                    None => OwnerBytes::Stored(&[]),
                }
            }
            _ => OwnerBytes::Stored(&[]),
        }
    }

    /// The reentrancy count (a shared value: its number of holders).
    pub fn count(&self) -> u64 {
        match self.shared() {
            Some(holds) => holds.len() as u64,
            None => self.numbers().map_or(0, |n| n.count),
        }
    }

    /// The fence (a shared value: the highest of its holders').
    pub fn fence(&self) -> u64 {
        match self.shared() {
            Some(holds) => holds.holders().map(|h| h.hold.fence).max().unwrap_or(0),
            None => self.numbers().map_or(0, |n| n.fence),
        }
    }

    /// The stored lease end (a shared value: the latest of its holders').
    pub fn lease(&self) -> u64 {
        match self.shared() {
            Some(holds) => holds.latest_lease().unwrap_or(0),
            None => self.numbers().map_or(0, |n| n.lease),
        }
    }

    /// When the hold began, unix ms (exclusive values).
    pub fn since(&self) -> u64 {
        self.numbers().map_or(0, |n| n.since)
    }

    /// Writes `numbers` in place: `false` if they do not fit this
    /// value's form (a compact value whose fence, count or lease moved
    /// too far), and the caller stores a new value.
    fn set_numbers(&mut self, numbers: Numbers) -> bool {
        match self.form() {
            COMPACT => {
                let Ok(bytes) = <&[u8; COMPACT_LEN]>::try_from(self.bytes()) else {
                    return false;
                };
                let Some(new) = compact(&uncompact(bytes).0, numbers) else {
                    return false;
                };
                self.bytes_mut().copy_from_slice(&new);
                true
            }
            WIDE => {
                let (len, packed) = self.wide_owner();
                self.head = wide_head(len, packed, numbers);
                true
            }
            _ => true,
        }
    }

    /// Sets the stored lease end of an exclusive value; `false`: it does
    /// not fit this value, store a new one.
    #[must_use]
    pub fn set_lease(&mut self, lease: u64) -> bool {
        match self.numbers() {
            Some(n) => self.set_numbers(Numbers { lease, ..n }),
            None => true,
        }
    }

    /// The holds in this value, of either mode, as the core sees them.
    pub fn holds(&self) -> Holds {
        match self.shared() {
            Some(holds) => holds.clone(),
            None => {
                let n = self.numbers().unwrap_or(Numbers {
                    count: 0,
                    fence: 0,
                    lease: 0,
                    since: 0,
                });
                Holds::from_parts(
                    Mode::Exclusive,
                    vec![Holder {
                        owner: self.owner().to_vec(),
                        hold: Hold {
                            count: n.count,
                            fence: n.fence,
                            expires_at: n.lease,
                        },
                        since: n.since,
                        permits: 1,
                    }],
                )
            }
        }
    }

    /// Calls `f` with each hold's (fence, lease end), without allocating.
    pub fn for_each_hold(&self, f: &mut dyn FnMut(u64, u64)) {
        match self.shared() {
            Some(holds) => {
                for h in holds.holders() {
                    f(h.hold.fence, h.hold.expires_at);
                }
            }
            None => f(self.fence(), self.lease()),
        }
    }

    /// Each hold as (fence, lease end), for the hold-time record.
    pub fn hold_ends(&self) -> Vec<(u64, u64)> {
        match self.shared() {
            Some(holds) => holds
                .holders()
                .map(|h| (h.hold.fence, h.hold.expires_at))
                .collect(),
            None => vec![(self.fence(), self.lease())],
        }
    }

    /// Bytes this value takes, for `MEMORY USAGE`.
    pub fn size(&self) -> usize {
        match self.shared() {
            Some(holds) => {
                std::mem::size_of::<SharedLock>()
                    + holds
                        .holders()
                        .map(|h| std::mem::size_of::<Holder>() + h.owner.len())
                        .sum::<usize>()
            }
            None => self.bytes().len(),
        }
    }

    /// Writes the numbers of `hold` in place in an exclusive value (the
    /// owner and start are unchanged); `false`: they do not fit this
    /// value, store a new one with [`StoredLock::new_raw`].
    #[must_use]
    pub fn set_hold(&mut self, hold: Hold) -> bool {
        match self.numbers() {
            Some(n) => self.set_numbers(Numbers {
                count: hold.count.min(u64::from(u32::MAX)),
                fence: hold.fence,
                lease: hold.expires_at.min(MAX_TIME),
                since: n.since,
            }),
            None => true,
        }
    }
}

/// Counts a value just made, and lets the notifications know locks exist.
fn born(value: *mut c_void) -> *mut c_void {
    stats::HELD.add(1);
    // Before the notifications about this value's key (`RESTORE` sends
    // `restore` right after loading it).
    lock_may_exist();
    value
}

/// Makes a value holding `holds`: the compact exclusive one for a single
/// exclusive holder, a shared one otherwise; null when there is no holder.
pub fn new_value(holds: Holds) -> *mut c_void {
    if holds.is_empty() {
        return ptr::null_mut();
    }
    match (holds.mode(), holds.only()) {
        (Mode::Exclusive, Some(one)) => StoredLock::new_raw(
            &one.owner,
            one.hold.count,
            one.hold.fence,
            one.hold.expires_at,
            one.since,
        ),
        _ => StoredLock::new_shared(holds),
    }
}

/// Registered at load time; its `raw_type` is set then.
pub static LOCK_TYPE: RedisType = RedisType::new(
    "redislock",
    ENCODING_VERSION,
    raw::RedisModuleTypeMethods {
        // 4: the newest method set Redis 7.0 knows (unlink2, copy2, …).
        version: 4,
        rdb_load: Some(rdb_load),
        rdb_save: Some(rdb_save),
        aof_rewrite: Some(aof_rewrite),
        mem_usage: Some(mem_usage),
        digest: Some(digest),
        free: Some(free),
        aux_load: Some(aux_load),
        aux_save: Some(aux_save),
        aux_save_triggers: raw::REDISMODULE_AUX_AFTER_RDB as c_int,
        free_effort: None,
        unlink: None,
        copy: Some(copy),
        defrag: None,
        mem_usage2: None,
        free_effort2: None,
        unlink2: Some(unlink2),
        copy2: None,
        aux_save2: None,
    },
);

/// The raw type pointer, for opening and setting keys.
pub fn raw_type() -> *mut raw::RedisModuleType {
    *LOCK_TYPE.raw_type.borrow()
}

/// A value Redis passes to a callback.
///
/// # Safety
/// `value` must be a live value of this type, alive for `'a`.
unsafe fn value_ref<'a>(value: *const c_void) -> &'a StoredLock {
    // SAFETY: the caller's contract.
    unsafe { &*value.cast::<StoredLock>() }
}

// ---------------------------------------------------------------------------
// Callbacks. Each is a thin shim behind the panic guard: SAFETY notes, then
// safe code.
// ---------------------------------------------------------------------------

/// Loads one lock value written by any encoding version this module ever used.
extern "C" fn rdb_load(rdb: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    guard("rdb_load", ptr::null_mut(), || match encver {
        1..=ENCODING_VERSION => load(rdb, encver).unwrap_or(ptr::null_mut()),
        other => {
            logging::log_warning(format!(
                "lock: cannot load a lock value of encoding version {other} \
                 (this module knows 1..={ENCODING_VERSION}); upgrade the module"
            ));
            ptr::null_mut()
        }
    })
}

/// Version 1: owner, count, fence. Version 2 adds the lease end. Version 3:
/// the mode, the limit, then each holder with its start.
fn load(rdb: *mut raw::RedisModuleIO, encver: c_int) -> Option<*mut c_void> {
    // SAFETY: Redis passes a live IO context; the name it returns (or
    // null) lives as long as the load.
    let name = unsafe { raw::RedisModule_GetKeyNameFromIO.map_or(ptr::null(), |f| f(rdb)) };
    if name.is_null() {
        lock_names::note_unknown();
    } else {
        lock_names::note_lock_name(RedisString::string_as_slice(name));
    }
    if encver >= 3 {
        return load_holds(rdb, encver);
    }
    let owner = raw::load_string_buffer(rdb).ok()?;
    let count = raw::load_unsigned(rdb).ok()?;
    let fence = raw::load_unsigned(rdb).ok()?;
    let lease = if encver >= 2 {
        from_wall(raw::load_unsigned(rdb).ok()?)
    } else {
        V1_LOADED.fetch_add(1, Relaxed);
        LEASE_UNKNOWN
    };
    let holder = checked_holder(owner.as_ref(), count, fence, lease, now_ms())?;
    fence::observe(fence);
    Some(new_value(Holds::from_parts(Mode::Exclusive, vec![holder]))).filter(|v| !v.is_null())
}

/// A holder as loaded, if it is sane.
fn checked_holder(owner: &[u8], count: u64, fence: u64, lease: u64, since: u64) -> Option<Holder> {
    if owner.is_empty() || owner.len() > MAX_OWNER_LEN || count == 0 || fence == 0 {
        logging::log_warning("lock: refusing a corrupt lock value (empty owner, count or fence)");
        return None;
    }
    Some(Holder {
        owner: owner.to_vec(),
        hold: Hold {
            count: count.min(MAX_COUNT),
            fence,
            expires_at: lease,
        },
        since,
        permits: 1,
    })
}

/// Version 3: mode, limit, holders, then each holder; version 4 adds each
/// holder's permits.
fn load_holds(rdb: *mut raw::RedisModuleIO, encver: c_int) -> Option<*mut c_void> {
    let mode = raw::load_unsigned(rdb).ok()?;
    let limit = raw::load_unsigned(rdb).ok()?;
    let n = raw::load_unsigned(rdb).ok()?;
    let mode = match (mode, limit) {
        (0, _) => Mode::Exclusive,
        (1, 0) => Mode::READ,
        (1, n) => Mode::Shared {
            limit: Some(u32::try_from(n).ok()?),
        },
        _ => {
            logging::log_warning("lock: refusing a lock value of an unknown mode");
            return None;
        }
    };
    if n == 0 || (mode == Mode::Exclusive && n != 1) {
        logging::log_warning("lock: refusing a corrupt lock value (holders)");
        return None;
    }
    let mut holders = Vec::new();
    for _ in 0..n {
        let owner = raw::load_string_buffer(rdb).ok()?;
        let count = raw::load_unsigned(rdb).ok()?;
        let fence = raw::load_unsigned(rdb).ok()?;
        let lease = from_wall(raw::load_unsigned(rdb).ok()?);
        let since = from_wall(raw::load_unsigned(rdb).ok()?);
        let mut holder = checked_holder(owner.as_ref(), count, fence, lease, since)?;
        if encver >= 4 {
            let permits = raw::load_unsigned(rdb).ok()?;
            holder.permits = u32::try_from(permits)
                .ok()
                .filter(|&k| k >= 1 && u64::from(k) <= mode.capacity())?;
        }
        holders.push(holder);
    }
    // A fence that arrives from a file or a master moves our counter, so the
    // next fence this server issues is above it.
    for holder in &holders {
        fence::observe(holder.hold.fence);
    }
    Some(new_value(Holds::from_parts(mode, holders))).filter(|v| !v.is_null())
}

/// Saves one lock value in the current encoding.
extern "C" fn rdb_save(rdb: *mut raw::RedisModuleIO, value: *mut c_void) {
    guard("rdb_save", (), || {
        // SAFETY: Redis passes a value this type created, alive for the call.
        let lock = unsafe { value_ref(value) };
        let holds = lock.holds();
        let (mode, limit) = match holds.mode() {
            Mode::Exclusive => (0, 0),
            Mode::Shared { limit } => (1, limit.map_or(0, u64::from)),
        };
        raw::save_unsigned(rdb, mode);
        raw::save_unsigned(rdb, limit);
        raw::save_unsigned(rdb, holds.holders().len() as u64);
        for holder in holds.holders() {
            raw::save_slice(rdb, &holder.owner);
            raw::save_unsigned(rdb, holder.hold.count);
            raw::save_unsigned(rdb, holder.hold.fence);
            // Files hold wall-clock times, read by whoever loads them.
            raw::save_unsigned(rdb, to_wall(holder.hold.expires_at));
            raw::save_unsigned(rdb, to_wall(holder.since));
            raw::save_unsigned(rdb, u64::from(holder.permits));
        }
    });
}

/// Writes the lock as `LOCK.APPLY key owner count fence [PXAT lease]`, a
/// shared one as `LOCK.APPLY key SHARED limit` and each holder's `owner
/// count fence lease since`; Redis follows it with a `PEXPIREAT` for the
/// key's TTL.
extern "C" fn aof_rewrite(
    aof: *mut raw::RedisModuleIO,
    key: *mut raw::RedisModuleString,
    value: *mut c_void,
) {
    guard("aof_rewrite", (), || {
        // SAFETY: Redis passes a value this type created, alive for the call.
        let lock = unsafe { value_ref(value) };
        // SAFETY: the API table is filled in at module load.
        let Some(emit) = (unsafe { raw::RedisModule_EmitAOF }) else {
            return;
        };
        if let Some(holds) = lock.shared() {
            let args = shared_apply_args(holds);
            // SAFETY: "sv": the key, then an array of live strings and its
            // length; Redis copies them.
            unsafe {
                emit(
                    aof,
                    c"LOCK.APPLY".as_ptr(),
                    c"sv".as_ptr(),
                    key,
                    args.as_ptr(),
                    args.len(),
                );
            }
            free_strings(args);
            return;
        }
        let (Ok(count), Ok(fence), Ok(lease)) = (
            CString::new(lock.count().to_string()),
            CString::new(lock.fence().to_string()),
            CString::new(to_wall(lock.lease()).to_string()),
        ) else {
            return;
        };
        let owner = lock.owner();
        // SAFETY: each format matches its arguments: a RedisModuleString, a
        // (pointer, length) buffer, then NUL-terminated C strings.
        unsafe {
            if lock.lease() == LEASE_UNKNOWN {
                emit(
                    aof,
                    c"LOCK.APPLY".as_ptr(),
                    c"sbcc".as_ptr(),
                    key,
                    owner.as_ptr(),
                    owner.len(),
                    count.as_ptr(),
                    fence.as_ptr(),
                );
            } else {
                emit(
                    aof,
                    c"LOCK.APPLY".as_ptr(),
                    c"sbcccc".as_ptr(),
                    key,
                    owner.as_ptr(),
                    owner.len(),
                    count.as_ptr(),
                    fence.as_ptr(),
                    c"PXAT".as_ptr(),
                    lease.as_ptr(),
                );
            }
        }
    });
}

/// The arguments after the key of the shared form of `LOCK.APPLY`:
/// `SHARED limit` (0: none), then `owner count fence lease since` per
/// holder, oldest first. Strings made without a context: the caller frees
/// them with [`free_strings`] once sent.
pub fn shared_apply_args(holds: &Holds) -> Vec<*mut raw::RedisModuleString> {
    let limit = match holds.mode() {
        Mode::Shared { limit } => limit.map_or(0, u64::from),
        Mode::Exclusive => 0,
    };
    // `SHAREDP`: each holder with its permits, when one is worth more
    // than one (a file without them stays readable by older modules).
    let with_permits = holds.holders().any(|h| h.permits != 1);
    let word: &[u8] = if with_permits { b"SHAREDP" } else { b"SHARED" };
    let mut words: Vec<Vec<u8>> = vec![word.to_vec(), limit.to_string().into_bytes()];
    for holder in holds.holders() {
        words.push(holder.owner.clone());
        for n in [
            holder.hold.count,
            holder.hold.fence,
            to_wall(holder.hold.expires_at),
            to_wall(holder.since),
        ] {
            words.push(n.to_string().into_bytes());
        }
        if with_permits {
            words.push(holder.permits.to_string().into_bytes());
        }
    }
    words
        .iter()
        .filter_map(|word| {
            // SAFETY: a null context makes a string the caller frees; the
            // bytes are copied.
            let made = unsafe {
                raw::RedisModule_CreateString
                    .map(|f| f(ptr::null_mut(), word.as_ptr().cast(), word.len()))
            };
            made.filter(|s| !s.is_null())
        })
        .collect()
}

/// Frees strings made by [`shared_apply_args`].
pub fn free_strings(strings: Vec<*mut raw::RedisModuleString>) {
    for string in strings {
        // SAFETY: each was made with a null context and is not used again.
        unsafe {
            if let Some(free) = raw::RedisModule_FreeString {
                free(ptr::null_mut(), string);
            }
        }
    }
}

/// Bytes this value uses, for `MEMORY USAGE`.
extern "C" fn mem_usage(value: *const c_void) -> usize {
    // SAFETY: Redis passes a value this type created, alive for the call.
    guard("mem_usage", 0, || unsafe { value_ref(value) }.size())
}

/// Feeds `DEBUG DIGEST`, so master and replica digests can be compared.
extern "C" fn digest(md: *mut raw::RedisModuleDigest, value: *mut c_void) {
    guard("digest", (), || {
        // SAFETY: Redis passes a value this type created and a live digest.
        unsafe {
            let lock = value_ref(value);
            if let (Some(add_buf), Some(add_ll), Some(end)) = (
                raw::RedisModule_DigestAddStringBuffer,
                raw::RedisModule_DigestAddLongLong,
                raw::RedisModule_DigestEndSequence,
            ) {
                // The mode and limit first: a read lock, a semaphore and an
                // exclusive hold with the same holder digest apart.
                let holds = lock.holds();
                let (mode, limit) = match holds.mode() {
                    Mode::Exclusive => (0, 0),
                    Mode::Shared { limit } => (1, limit.map_or(0, i64::from)),
                };
                add_ll(md, mode);
                add_ll(md, limit);
                for holder in holds.holders() {
                    let owner = &holder.owner;
                    add_buf(md, owner.as_ptr().cast_mut().cast(), owner.len());
                    add_ll(md, holder.hold.count as i64);
                    add_ll(md, holder.hold.fence as i64);
                    add_ll(md, to_wall(holder.hold.expires_at) as i64);
                    add_ll(md, i64::from(holder.permits));
                }
                end(md);
            }
        }
    });
}

/// Frees a value Redis no longer needs (may run on a lazy-free thread).
extern "C" fn free(value: *mut c_void) {
    // SAFETY: Redis frees each value it got from us exactly once, and
    // passes one this type created, alive until freed here.
    guard("free", (), || unsafe {
        if let Some(lock) = value.cast::<StoredLock>().as_ref() {
            if latency::any_open() {
                latency::value_freed(|each| lock.for_each_hold(each));
            }
        }
        StoredLock::free_raw(value)
    });
}

/// A lock key leaves the keyspace (DEL, expiry, eviction, overwrite…): note
/// which, so that the keyspace events can tell a lease end from other
/// deletions ([`expired_held::take_unlinked`]).
extern "C" fn unlink2(ctx: *mut raw::RedisModuleKeyOptCtx, value: *const c_void) {
    guard("unlink2", (), || {
        // SAFETY: Redis passes a live option context for this call.
        let (name, db) = unsafe {
            let name = raw::RedisModule_GetKeyNameFromOptCtx.map_or(ptr::null(), |f| f(ctx));
            let db = raw::RedisModule_GetDbIdFromOptCtx.map_or(-1, |f| f(ctx));
            (name, db)
        };
        if !name.is_null() {
            let name = RedisString::string_as_slice(name);
            expired_held::lock_unlinked(db, name);
            // SAFETY: Redis passes a value this type created, alive for the call.
            let lock = unsafe { value_ref(value) };
            lease_clock::unlinked(db, name, || lock.holds());
        }
    });
}

/// `COPY`: an independent copy of the value (same holders, counts, fences, leases).
extern "C" fn copy(
    _from: *mut raw::RedisModuleString,
    to: *mut raw::RedisModuleString,
    value: *const c_void,
) -> *mut c_void {
    guard("copy", ptr::null_mut(), || {
        if to.is_null() {
            lock_names::note_unknown();
        } else {
            lock_names::note_lock_name(RedisString::string_as_slice(to));
        }
        // SAFETY: Redis passes a value this type created, alive for the call.
        let lock = unsafe { value_ref(value) };
        new_value(lock.holds())
    })
}

/// Saves the fence counter beside the keys, so a restart from RDB continues it.
extern "C" fn aux_save(rdb: *mut raw::RedisModuleIO, _when: c_int) {
    guard("aux_save", (), || raw::save_unsigned(rdb, fence::last()));
}

/// Loads the fence counter (every version: one unsigned).
extern "C" fn aux_load(rdb: *mut raw::RedisModuleIO, encver: c_int, _when: c_int) -> c_int {
    guard("aux_load", raw::Status::Err as c_int, || {
        if encver > ENCODING_VERSION {
            return raw::Status::Err as c_int;
        }
        match raw::load_unsigned(rdb) {
            Ok(last) => {
                fence::observe(last);
                raw::Status::Ok as c_int
            }
            Err(_) => raw::Status::Err as c_int,
        }
    })
}
