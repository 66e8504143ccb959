//! The embedded store's elections: per election, a queue of candidacies in
//! arrival order; the first one whose lease is live leads.
//!
//! The queues are persisted with the rest of the state. They must be: leases
//! survive a restart of the store (with a full TTL), so a leader whose lease
//! survives must still lead afterwards, or a standby could win while the old
//! leader, renewing its lease happily, still acts. Waiting campaign calls do
//! not survive a restart (their connections break); their candidacies do,
//! and a caller that campaigns again under the same lease rejoins its place.
//!
//! A candidacy whose lease is gone is skipped by every read at once, and
//! removed (removal persisted, waiters woken) by the lease reaper, by
//! `revoke_lease`, and by the next mutation that looks at the queue.
//!
//! Each campaign call *attaches* to its candidacy with a fresh number (in
//! memory only). When a call is dropped before it returned, it withdraws the
//! candidacy only if no later call has attached since: a client that lost
//! its connection and campaigned again under the same lease keeps its place
//! (and its leadership) even if the server notices the first call's death
//! only afterwards.

use crate::{Leadership, LeaseId};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};

/// A candidacy as written to the state file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct CandidacyRecord {
    pub id: u64,
    pub candidate: String,
    pub lease: u64,
}

#[derive(Clone, Debug)]
struct Candidacy {
    /// Never reused across elections; the leadership's token.
    id: u64,
    candidate: String,
    lease: LeaseId,
    /// The campaign call attached last (0: none since the store opened).
    attach: u64,
}

/// Every election's queue, and the candidacy-id allocator.
#[derive(Debug)]
pub(crate) struct Elections {
    queues: BTreeMap<String, VecDeque<Candidacy>>,
    next_id: u64,
    next_attach: u64,
}

impl Default for Elections {
    fn default() -> Self {
        Elections {
            queues: BTreeMap::new(),
            next_id: 1,
            next_attach: 1,
        }
    }
}

/// Where a candidacy stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Standing {
    Leads(Leadership),
    Waits,
    /// Withdrawn, resigned, or its lease is gone.
    Gone,
}

/// A campaign call's hold on its candidacy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Joined {
    pub id: u64,
    pub attach: u64,
    /// Whether the queue changed (new candidacy or new name): persist.
    pub changed: bool,
}

/// The token of candidacy `id`.
pub(crate) fn token(id: u64) -> Vec<u8> {
    id.to_be_bytes().to_vec()
}

fn token_id(token: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(token.try_into().ok()?))
}

impl Elections {
    /// Restores persisted queues (attachments start empty).
    pub fn restore(records: BTreeMap<String, Vec<CandidacyRecord>>, next_id: u64) -> Self {
        let mut e = Elections {
            next_id: next_id.max(1),
            ..Elections::default()
        };
        for (election, queue) in records {
            let queue: VecDeque<Candidacy> = queue
                .into_iter()
                .map(|r| Candidacy {
                    id: r.id,
                    candidate: r.candidate,
                    lease: LeaseId(r.lease),
                    attach: 0,
                })
                .collect();
            if let Some(max) = queue.iter().map(|c| c.id).max() {
                e.next_id = e.next_id.max(max + 1);
                e.queues.insert(election, queue);
            }
        }
        e
    }

    /// The queues, for the state file.
    pub fn records(&self) -> BTreeMap<String, Vec<CandidacyRecord>> {
        self.queues
            .iter()
            .map(|(election, queue)| {
                let queue = queue
                    .iter()
                    .map(|c| CandidacyRecord {
                        id: c.id,
                        candidate: c.candidate.clone(),
                        lease: c.lease.0,
                    })
                    .collect();
                (election.clone(), queue)
            })
            .collect()
    }

    pub fn next_id(&self) -> u64 {
        self.next_id
    }

    /// Joins `election` as `candidate` under `lease` (checked live by the
    /// caller), or rejoins the lease's candidacy there (renaming it).
    pub fn join(&mut self, election: &str, candidate: &str, lease: LeaseId) -> Joined {
        let attach = self.next_attach;
        self.next_attach += 1;
        let queue = self.queues.entry(election.to_string()).or_default();
        if let Some(c) = queue.iter_mut().find(|c| c.lease == lease) {
            c.attach = attach;
            let changed = c.candidate != candidate;
            if changed {
                c.candidate = candidate.to_string();
            }
            return Joined {
                id: c.id,
                attach,
                changed,
            };
        }
        let id = self.next_id;
        self.next_id += 1;
        queue.push_back(Candidacy {
            id,
            candidate: candidate.to_string(),
            lease,
            attach,
        });
        Joined {
            id,
            attach,
            changed: true,
        }
    }

    /// The leader: the first candidacy whose lease is live.
    pub fn leader(&self, election: &str, live: impl Fn(LeaseId) -> bool) -> Option<Leadership> {
        let head = self.queues.get(election)?.iter().find(|c| live(c.lease))?;
        Some(leadership(election, head))
    }

    /// Where candidacy `id` stands in `election`.
    pub fn standing(&self, election: &str, id: u64, live: impl Fn(LeaseId) -> bool) -> Standing {
        let Some(queue) = self.queues.get(election) else {
            return Standing::Gone;
        };
        match queue.iter().find(|c| c.id == id) {
            Some(c) if live(c.lease) => match self.leader(election, live) {
                Some(l) if l.token == token(id) => Standing::Leads(l),
                _ => Standing::Waits,
            },
            _ => Standing::Gone,
        }
    }

    /// Removes candidacy `id` if the call `attach` is still the last one
    /// attached to it. Returns whether it removed it.
    pub fn withdraw(&mut self, election: &str, id: u64, attach: u64) -> bool {
        self.remove_where(election, |c| c.id == id && c.attach == attach)
    }

    /// Removes the candidacy `leadership` names, if it is still there.
    pub fn resign(&mut self, leadership: &Leadership) -> bool {
        let Some(id) = token_id(&leadership.token) else {
            return false;
        };
        self.remove_where(&leadership.election, |c| {
            c.id == id && c.lease == leadership.lease
        })
    }

    /// Removes every candidacy whose lease is not live; returns whether any was.
    pub fn retain_live(&mut self, live: impl Fn(LeaseId) -> bool) -> bool {
        let mut changed = false;
        self.queues.retain(|_, queue| {
            let before = queue.len();
            queue.retain(|c| live(c.lease));
            changed |= queue.len() != before;
            !queue.is_empty()
        });
        changed
    }

    fn remove_where(&mut self, election: &str, pred: impl Fn(&Candidacy) -> bool) -> bool {
        let Some(queue) = self.queues.get_mut(election) else {
            return false;
        };
        let before = queue.len();
        queue.retain(|c| !pred(c));
        let removed = queue.len() != before;
        if queue.is_empty() {
            self.queues.remove(election);
        }
        removed
    }
}

fn leadership(election: &str, c: &Candidacy) -> Leadership {
    Leadership {
        election: election.to_string(),
        candidate: c.candidate.clone(),
        lease: c.lease,
        token: token(c.id),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const E: &str = "e";

    fn all_live(_: LeaseId) -> bool {
        true
    }

    #[test]
    fn first_come_first_served_and_dead_leases_are_skipped() {
        let mut e = Elections::default();
        let a = e.join(E, "a", LeaseId(1));
        let b = e.join(E, "b", LeaseId(2));
        let c = e.join(E, "c", LeaseId(3));
        assert!(a.changed && b.changed && c.changed);
        assert_eq!(e.leader(E, all_live).unwrap().candidate, "a");
        assert_eq!(e.standing(E, b.id, all_live), Standing::Waits);
        // a's lease dies: b leads at once, even before anyone removes a.
        let live = |l: LeaseId| l != LeaseId(1);
        assert_eq!(e.leader(E, live).unwrap().candidate, "b");
        assert!(matches!(e.standing(E, b.id, live), Standing::Leads(_)));
        assert_eq!(e.standing(E, a.id, live), Standing::Gone);
        assert!(e.retain_live(live));
        assert!(!e.retain_live(live));
        // b resigns: c leads; resigning again changes nothing.
        let lb = e.leader(E, all_live).unwrap();
        assert!(e.resign(&lb));
        assert!(!e.resign(&lb));
        assert_eq!(e.leader(E, all_live).unwrap().candidate, "c");
        assert_eq!(e.leader("other", all_live), None);
    }

    #[test]
    fn rejoining_under_the_same_lease_keeps_the_place_and_the_token() {
        let mut e = Elections::default();
        let a = e.join(E, "a", LeaseId(1));
        let b1 = e.join(E, "b", LeaseId(2));
        let b2 = e.join(E, "b", LeaseId(2));
        assert_eq!(b1.id, b2.id);
        assert!(!b2.changed);
        assert_ne!(b1.attach, b2.attach);
        // The first call's late withdrawal must not remove the rejoined candidacy.
        assert!(!e.withdraw(E, b1.id, b1.attach));
        assert_eq!(e.standing(E, b1.id, all_live), Standing::Waits);
        let renamed = e.join(E, "b2", LeaseId(2));
        assert!(renamed.changed);
        assert!(e.withdraw(E, renamed.id, renamed.attach));
        assert_eq!(e.standing(E, b1.id, all_live), Standing::Gone);
        assert_eq!(e.leader(E, all_live).unwrap().token, token(a.id));
    }

    #[test]
    fn records_round_trip_and_ids_are_never_reused() {
        let mut e = Elections::default();
        e.join(E, "a", LeaseId(1));
        let b = e.join("f", "b", LeaseId(2));
        let back = Elections::restore(e.records(), e.next_id());
        assert_eq!(back.records(), e.records());
        assert_eq!(back.leader("f", all_live), e.leader("f", all_live));
        let mut back = Elections::restore(e.records(), 0);
        let c = back.join(E, "c", LeaseId(3));
        assert!(c.id > b.id);
        // Restored candidacies have no attached call: no call's drop withdraws them.
        assert!(!back.withdraw("f", b.id, c.attach));
        assert!(back.records().contains_key("f"));
    }
}
