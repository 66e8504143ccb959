//! The embedded store's migration records: the id allocator and the records
//! by id, persisted in the state file (absent in files written before
//! migrations existed: an empty table). Pure logic; the store runs each call
//! under its one lock and persists after every change.

use crate::store::{check_migration_put, migration_id_not_allocated};
use crate::{MetaError, StoredMigration};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A record as persisted (`record` as a JSON array of bytes).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct MigrationRecord {
    pub id: u64,
    pub generation: u64,
    pub record: Vec<u8>,
}

/// Every migration record, and the next id to hand out.
#[derive(Debug)]
pub(crate) struct Migrations {
    /// Starts at 1, never reused.
    next_id: u64,
    records: BTreeMap<u64, (u64, Vec<u8>)>,
}

impl Default for Migrations {
    fn default() -> Self {
        Migrations {
            next_id: 1,
            records: BTreeMap::new(),
        }
    }
}

impl Migrations {
    /// The table from the state file. The allocator is kept past every
    /// stored id, whatever the file says.
    pub fn restore(records: Vec<MigrationRecord>, next_id: u64) -> Self {
        let records: BTreeMap<_, _> = records
            .into_iter()
            .map(|r| (r.id, (r.generation, r.record)))
            .collect();
        let past_stored = records.keys().next_back().map_or(1, |id| id + 1);
        Migrations {
            next_id: next_id.max(past_stored).max(1),
            records,
        }
    }

    pub fn next_id(&self) -> u64 {
        self.next_id
    }

    /// The records for the state file, by id.
    pub fn records(&self) -> Vec<MigrationRecord> {
        self.list()
            .into_iter()
            .map(|m| MigrationRecord {
                id: m.id,
                generation: m.generation,
                record: m.record,
            })
            .collect()
    }

    /// Hands out the next id (the caller persists before answering).
    pub fn allocate(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// See [`crate::MetaStore::put_migration`]. Changes nothing on error.
    pub fn put(
        &mut self,
        id: u64,
        expected: Option<u64>,
        generation: u64,
        record: Vec<u8>,
    ) -> Result<(), MetaError> {
        self.check_put(id, expected, generation)?;
        self.records.insert(id, (generation, record));
        Ok(())
    }

    /// What [`Self::put`] would refuse, without writing.
    pub fn check_put(
        &self,
        id: u64,
        expected: Option<u64>,
        generation: u64,
    ) -> Result<(), MetaError> {
        check_migration_put(id, expected, generation)?;
        if expected.is_none() && id >= self.next_id {
            return Err(migration_id_not_allocated(id));
        }
        let current = self.records.get(&id).map(|(g, _)| *g);
        if current != expected {
            return Err(MetaError::MigrationConflict { id, current });
        }
        Ok(())
    }

    pub fn get(&self, id: u64) -> Option<StoredMigration> {
        self.records
            .get(&id)
            .map(|(generation, record)| StoredMigration {
                id,
                generation: *generation,
                record: record.clone(),
            })
    }

    /// Every record, by id.
    pub fn list(&self) -> Vec<StoredMigration> {
        self.records
            .iter()
            .map(|(id, (generation, record))| StoredMigration {
                id: *id,
                generation: *generation,
                record: record.clone(),
            })
            .collect()
    }

    /// See [`crate::MetaStore::delete_migration`]. Changes nothing on error.
    pub fn delete(&mut self, id: u64, expected: u64) -> Result<(), MetaError> {
        let current = self.records.get(&id).map(|(g, _)| *g);
        if current != Some(expected) {
            return Err(MetaError::MigrationConflict { id, current });
        }
        self.records.remove(&id);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cas_and_allocation() {
        let mut m = Migrations::default();
        let (a, b) = (m.allocate(), m.allocate());
        assert_eq!((a, b), (1, 2));
        assert!(matches!(
            m.put(3, None, 1, vec![]),
            Err(MetaError::InvalidArgument(_))
        ));
        m.put(a, None, 1, b"x".to_vec()).unwrap();
        assert_eq!(
            m.put(a, None, 2, vec![]),
            Err(MetaError::MigrationConflict {
                id: a,
                current: Some(1)
            })
        );
        m.put(a, Some(1), 5, b"y".to_vec()).unwrap();
        assert_eq!(
            m.delete(b, 1),
            Err(MetaError::MigrationConflict {
                id: b,
                current: None
            })
        );
        let restored = Migrations::restore(m.records(), 0);
        assert_eq!(restored.next_id(), 2, "past every stored id");
        assert_eq!(restored.list(), m.list());
        m.delete(a, 5).unwrap();
        assert_eq!(m.get(a), None);
        assert_eq!(m.allocate(), 3);
    }
}
