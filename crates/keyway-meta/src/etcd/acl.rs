//! ACL user records: `<p>/acl/users/<name>` holds one user's rules (UTF-8,
//! as `ACL LIST` prints them; see `docs/etcd.md`). A put replaces the
//! record whole and a delete removes it; both are idempotent, so they are
//! retried across members like reads (a delete whose first answer was lost
//! may report that there was no record).

use super::Inner;
use crate::{AclRecord, MetaError};
use etcd_client::{DeleteOptions, GetOptions, PutOptions};

impl Inner {
    fn acl_prefix(&self) -> String {
        format!("{}/acl/users/", self.layout.prefix())
    }

    /// See [`crate::MetaStore::acl_users`]: one range read, by name.
    pub(super) async fn acl_users(&self) -> Result<Vec<AclRecord>, MetaError> {
        const WHAT: &str = "list ACL users";
        let prefix = self.acl_prefix();
        let resp = self
            .get(WHAT, prefix.clone(), GetOptions::new().with_prefix())
            .await
            .map_err(|e| e.into_meta(WHAT))?;
        let mut out = Vec::with_capacity(resp.kvs().len());
        for kv in resp.kvs() {
            let name = kv.key().strip_prefix(prefix.as_bytes()).unwrap_or(kv.key());
            let (Ok(name), Ok(rules)) =
                (std::str::from_utf8(name), std::str::from_utf8(kv.value()))
            else {
                return Err(MetaError::Internal(format!(
                    "corrupt ACL record at etcd key {:?}: not UTF-8",
                    String::from_utf8_lossy(kv.key())
                )));
            };
            out.push(AclRecord {
                name: name.to_string(),
                rules: rules.to_string(),
            });
        }
        Ok(out)
    }

    /// See [`crate::MetaStore::put_acl_user`].
    pub(super) async fn put_acl_user(&self, record: AclRecord) -> Result<(), MetaError> {
        const WHAT: &str = "write an ACL user";
        let key = format!("{}{}", self.acl_prefix(), record.name);
        self.conn
            .call(WHAT, true, |c| {
                let (key, value) = (key.clone(), record.rules.clone());
                async move { c.kv_client().put(key, value, Some(PutOptions::new())).await }
            })
            .await
            .map_err(|e| e.into_meta(WHAT))?;
        Ok(())
    }

    /// See [`crate::MetaStore::delete_acl_user`].
    pub(super) async fn delete_acl_user(&self, name: &str) -> Result<bool, MetaError> {
        const WHAT: &str = "delete an ACL user";
        let key = format!("{}{}", self.acl_prefix(), name);
        let resp = self
            .conn
            .call(WHAT, true, |c| {
                let key = key.clone();
                async move { c.kv_client().delete(key, Some(DeleteOptions::new())).await }
            })
            .await
            .map_err(|e| e.into_meta(WHAT))?;
        Ok(resp.deleted() > 0)
    }
}
