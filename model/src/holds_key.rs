//! A lock's key kept as the core's [`Holds`], read and written as the
//! module's `LockKey` does: one exclusive hold shown as its numbers (and
//! whether the asker owns it), listed holds taken out of the key until
//! written back. The hosts of the shared and the several-locks models keep
//! their keys this way.

use redislock_core::holds::{Holder, Holds, Mode};
use redislock_core::orchestrate::{Read, Stored, Write};

/// `Host::read` of the key `holds`.
pub fn read(holds: &mut Holds, how: Read<'_>) -> Stored {
    if holds.is_empty() && how != Read::Listed {
        return Stored::Free;
    }
    if let (Mode::Exclusive, Some(one), false) = (holds.mode(), holds.only(), how == Read::Listed) {
        let mine = matches!(how, Read::Mine(owner) if owner == one.owner.as_slice());
        return Stored::One {
            hold: one.hold,
            mine,
        };
    }
    Stored::Listed(std::mem::take(holds))
}

/// `Host::write` of `holds` into the key `slot`, at `now`.
pub fn write(slot: &mut Holds, holds: Write<'_>, now: u64) {
    *slot = match holds {
        Write::One { owner, hold, .. } => {
            // The hold's beginning stays with its owner.
            let since = match slot.only() {
                Some(one) if one.owner == owner => one.since,
                _ => now,
            };
            let holder = Holder {
                owner: owner.to_vec(),
                hold,
                since,
                permits: 1,
            };
            Holds::from_parts(Mode::Exclusive, vec![holder])
        }
        Write::Listed(mut holds) => {
            // The change log is the glue's, for replicas: not state.
            holds.take_changes();
            holds
        }
    };
}
