//! Opening the key slots of a namespace mount's encrypted drives with the
//! one user key it was given, at a bounded cost.
//!
//! Opening a passphrase slot runs Argon2id (64 MiB, a fraction of a second
//! of CPU per slot), so an open of an encrypted drive must not run it every
//! time: a data key once unlocked is kept and recognised by the drive's
//! check value (no slot opened again), a slot set the key did not open is
//! remembered as such (until the drive's slots change, which gives another
//! set), and at most [`MAX_CONCURRENT_UNLOCKS`] unlocks run at once, on the
//! blocking pool. Opens waiting for a permit look again once they hold it,
//! so N opens of one drive at once run Argon2 for it once.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Semaphore;

use crate::crypt::{DataKey, KeySlots, UserKey};

/// Unlocks that run Argon2 at once (each takes 64 MiB or more).
pub const MAX_CONCURRENT_UNLOCKS: usize = 2;

/// Slot sets remembered as not opened by the key (a namespace holds a few
/// drives; a bound keeps a changing account from growing it for ever).
const MAX_REMEMBERED_FAILURES: usize = 1024;

/// What an unlock found.
#[derive(Debug, Clone)]
pub enum Unlocked {
    /// The drive's data key (already known, or opened from slot `slot`).
    Key {
        /// The key.
        key: Arc<DataKey>,
        /// The slot opened now, `None` when the key was known.
        slot: Option<u8>,
    },
    /// The user key does not open the drive: why (the same answer for a
    /// slot set already tried).
    NotOpened(String),
}

/// The unlocks of one user key over the drives of a namespace mount.
pub struct Unlocker {
    user: Arc<UserKey>,
    /// Data keys unlocked so far.
    unlocked: Mutex<Vec<Arc<DataKey>>>,
    /// Slot sets the key did not open, with why.
    failed: Mutex<Vec<(KeySlots, String)>>,
    /// Slot sets being tried now, each with the lock the opens of that set
    /// wait on (so one of them runs Argon2, the others take its answer).
    trying: Mutex<Vec<(KeySlots, Arc<tokio::sync::Mutex<()>>)>>,
    permits: Semaphore,
    /// Slot sets tried (each a run of Argon2 per passphrase slot).
    attempts: AtomicU64,
}

impl Unlocker {
    /// Unlocks with `user`.
    pub fn new(user: UserKey) -> Self {
        Unlocker {
            user: Arc::new(user),
            unlocked: Mutex::new(Vec::new()),
            failed: Mutex::new(Vec::new()),
            trying: Mutex::new(Vec::new()),
            permits: Semaphore::new(MAX_CONCURRENT_UNLOCKS),
            attempts: AtomicU64::new(0),
        }
    }

    /// How many times a slot set was actually tried (for tests and logs).
    pub fn attempts(&self) -> u64 {
        self.attempts.load(Ordering::Relaxed)
    }

    /// The answer known without opening a slot, if any.
    fn known(&self, slots: &KeySlots) -> Option<Unlocked> {
        let unlocked = self.unlocked.lock().expect("unlocked keys poisoned");
        if let Some(key) = unlocked.iter().find(|k| slots.matches(k)) {
            return Some(Unlocked::Key {
                key: key.clone(),
                slot: None,
            });
        }
        drop(unlocked);
        let failed = self.failed.lock().expect("failed unlocks poisoned");
        failed
            .iter()
            .find(|(s, _)| s == slots)
            .map(|(_, why)| Unlocked::NotOpened(why.clone()))
    }

    /// The data key of the drive whose slots are `slots`, if the user key
    /// opens it. Err: the unlock task itself failed.
    pub async fn unlock(&self, slots: KeySlots) -> Result<Unlocked, String> {
        if let Some(known) = self.known(&slots) {
            return Ok(known);
        }
        let set_lock = {
            let mut trying = self.trying.lock().expect("trying unlocks poisoned");
            match trying.iter().find(|(s, _)| *s == slots) {
                Some((_, lock)) => lock.clone(),
                None => {
                    let lock = Arc::new(tokio::sync::Mutex::new(()));
                    trying.push((slots.clone(), lock.clone()));
                    lock
                }
            }
        };
        let _this_set = set_lock.lock().await;
        // Another open may have answered it while this one waited.
        if let Some(known) = self.known(&slots) {
            return Ok(known);
        }
        let result = self.try_slots(&slots).await;
        self.trying
            .lock()
            .expect("trying unlocks poisoned")
            .retain(|(s, _)| *s != slots);
        result
    }

    /// Runs the unlock of `slots` (Argon2 for a passphrase) under a permit,
    /// and remembers its answer.
    async fn try_slots(&self, slots: &KeySlots) -> Result<Unlocked, String> {
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|e| format!("unlock refused: {e}"))?;
        self.attempts.fetch_add(1, Ordering::Relaxed);
        let (user, tried) = (self.user.clone(), slots.clone());
        // Argon2id: off the async threads.
        let opened = tokio::task::spawn_blocking(move || tried.unlock(&user))
            .await
            .map_err(|e| format!("unlock task failed: {e}"))?;
        Ok(match opened {
            Ok((key, slot)) => {
                let key = Arc::new(key);
                self.unlocked
                    .lock()
                    .expect("unlocked keys poisoned")
                    .push(key.clone());
                Unlocked::Key {
                    key,
                    slot: Some(slot),
                }
            }
            Err(e) => {
                let why = e.to_string();
                let mut failed = self.failed.lock().expect("failed unlocks poisoned");
                if failed.len() >= MAX_REMEMBERED_FAILURES {
                    failed.remove(0);
                }
                failed.push((slots.clone(), why.clone()));
                Unlocked::NotOpened(why)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypt::Secret;

    fn passphrase(p: &str) -> UserKey {
        UserKey::Passphrase(Secret::copy_of(p.as_bytes()))
    }

    /// Many opens of a drive the passphrase does not open run Argon2 once,
    /// also when they come at once; the drive it opens is unlocked once too,
    /// and a changed slot set is tried again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_drive_the_key_does_not_open_is_tried_once() {
        let other = KeySlots::new(&DataKey::generate(), &passphrase("someone else's"));
        let unlocker = Arc::new(Unlocker::new(passphrase("mine")));
        let opens: Vec<_> = (0..8)
            .map(|_| {
                let (u, s) = (unlocker.clone(), other.clone());
                tokio::spawn(async move { u.unlock(s).await })
            })
            .collect();
        for open in opens {
            let got = open.await.unwrap().unwrap();
            assert!(matches!(got, Unlocked::NotOpened(_)), "{got:?}");
        }
        for _ in 0..8 {
            let got = unlocker.unlock(other.clone()).await.unwrap();
            assert!(matches!(got, Unlocked::NotOpened(_)));
        }
        assert_eq!(unlocker.attempts(), 1, "Argon2 ran once for 16 opens");

        let mine = KeySlots::new(&DataKey::generate(), &passphrase("mine"));
        for want in [Some(0), None, None] {
            match unlocker.unlock(mine.clone()).await.unwrap() {
                Unlocked::Key { slot, .. } => assert_eq!(slot, want),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(unlocker.attempts(), 2);

        // A drive's slots changed (a slot added for this passphrase): the
        // new set is tried, and opens.
        let data = DataKey::generate();
        let mut slots = KeySlots::new(&data, &passphrase("someone else's"));
        assert!(matches!(
            unlocker.unlock(slots.clone()).await.unwrap(),
            Unlocked::NotOpened(_)
        ));
        slots.add(&data, &passphrase("mine")).unwrap();
        assert!(matches!(
            unlocker.unlock(slots).await.unwrap(),
            Unlocked::Key { slot: Some(1), .. }
        ));
        assert_eq!(unlocker.attempts(), 4);
    }
}
