//! ACL user records: written, listed by name, replaced whole, deleted.

use super::Fixture;
use crate::AclRecord;

fn record(name: &str, rules: &str) -> AclRecord {
    AclRecord {
        name: name.to_string(),
        rules: rules.to_string(),
    }
}

pub async fn acl_users_are_written_listed_replaced_and_deleted(f: &Fixture) {
    let store = &f.store;
    assert_eq!(store.acl_users().await.unwrap(), vec![]);
    store
        .put_acl_user(record("bob", "on nopass ~* resetchannels +@all"))
        .await
        .unwrap();
    store
        .put_acl_user(record("alice", "off resetchannels -@all"))
        .await
        .unwrap();
    assert_eq!(
        store.acl_users().await.unwrap(),
        vec![
            record("alice", "off resetchannels -@all"),
            record("bob", "on nopass ~* resetchannels +@all"),
        ],
        "listed by name"
    );
    store
        .put_acl_user(record("alice", "on ~app:* resetchannels -@all +@read"))
        .await
        .unwrap();
    assert_eq!(
        store.acl_users().await.unwrap()[0],
        record("alice", "on ~app:* resetchannels -@all +@read"),
        "a put replaces the record"
    );
    assert!(store.delete_acl_user("bob").await.unwrap());
    assert!(!store.delete_acl_user("bob").await.unwrap(), "already gone");
    assert!(!store.delete_acl_user("nobody").await.unwrap());
    assert_eq!(
        store.acl_users().await.unwrap(),
        vec![record("alice", "on ~app:* resetchannels -@all +@read")]
    );
}

/// Names with spaces-free but unusual bytes (`/`, `:`, the empty name) are
/// kept apart: no name falls under another's key.
pub async fn acl_user_names_are_kept_apart(f: &Fixture) {
    let store = &f.store;
    for name in ["a", "a/b", "a:b", ""] {
        store
            .put_acl_user(record(name, &format!("on #{name}")))
            .await
            .unwrap();
    }
    let mut names: Vec<String> = store
        .acl_users()
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.name)
        .collect();
    names.sort();
    assert_eq!(names, vec!["", "a", "a/b", "a:b"]);
    assert!(store.delete_acl_user("a").await.unwrap());
    let left: Vec<AclRecord> = store.acl_users().await.unwrap();
    assert_eq!(left.len(), 3);
    assert!(left.iter().any(|r| r.name == "a/b" && r.rules == "on #a/b"));
}
