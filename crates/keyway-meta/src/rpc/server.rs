//! The gRPC server: serves any [`MetaStore`] (in practice the embedded one,
//! in the `keyway meta` process) to other processes.

use super::convert::{
    leadership_from_pb, leadership_to_pb, lease_to_pb, migration_to_pb, status_from_error,
    txn_from_pb, update_to_pb,
};
use super::pb::{self, meta_server};
use crate::{LeaseId, MetaError, MetaStore};
use futures::{Stream, StreamExt};
use keyway_map::{MapVersion, NodeId, encode_map};
use std::pin::Pin;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::{Request, Response, Status};

/// Serves `store` over gRPC on `listener` until `shutdown` resolves.
///
/// On shutdown the server stops accepting, ends every open watch stream with
/// an `UNAVAILABLE` status (so watchers re-watch elsewhere or later), lets
/// in-flight calls finish, and returns once every connection has closed.
pub async fn serve(
    store: Arc<dyn MetaStore>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), MetaError> {
    serve_with_secret(store, listener, None, shutdown).await
}

/// As [`serve`]; with `secret`, every call needs it (`Authorization: Bearer`,
/// see [`keyway_auth::AdminGuard`]) and is otherwise refused with gRPC
/// `UNAUTHENTICATED`.
pub async fn serve_with_secret(
    store: Arc<dyn MetaStore>,
    listener: TcpListener,
    secret: Option<keyway_auth::ClusterSecret>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), MetaError> {
    let guard =
        keyway_auth::AdminGuard::new("meta", secret, None, keyway_auth::AuthMetrics::default());
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "metadata server listening");
    }
    let (stop_tx, stop_rx) = watch::channel(false);
    let service = MetaService {
        store,
        stop: stop_rx,
    };
    let server = meta_server::MetaServer::new(service)
        .max_decoding_message_size(super::MAX_MESSAGE_BYTES)
        .max_encoding_message_size(super::MAX_MESSAGE_BYTES);
    let incoming = TcpListenerStream::new(listener).map(|conn| {
        if let Ok(stream) = &conn {
            let _ = stream.set_nodelay(true);
        }
        conn
    });
    tonic::transport::Server::builder()
        .layer(guard)
        .add_service(server)
        .serve_with_incoming_shutdown(incoming, async move {
            shutdown.await;
            let _ = stop_tx.send(true);
        })
        .await
        .map_err(|e| MetaError::Internal(format!("metadata server failed: {e}")))
}

/// Resolves once the server is shutting down.
async fn stopping(mut stop: watch::Receiver<bool>) {
    loop {
        let stopped = *stop.borrow_and_update();
        if stopped || stop.changed().await.is_err() {
            return;
        }
    }
}

struct MetaService {
    store: Arc<dyn MetaStore>,
    stop: watch::Receiver<bool>,
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<pb::MapUpdate, Status>> + Send + 'static>>;
type ObserveStream =
    Pin<Box<dyn Stream<Item = Result<pb::LeaderResponse, Status>> + Send + 'static>>;

fn shutting_down() -> Status {
    status(MetaError::Unavailable(
        "metadata server shutting down".into(),
    ))
}

fn status(e: MetaError) -> Status {
    status_from_error(&e)
}

#[tonic::async_trait]
impl meta_server::Meta for MetaService {
    async fn get_map(
        &self,
        _: Request<pb::GetMapRequest>,
    ) -> Result<Response<pb::GetMapResponse>, Status> {
        let map = self.store.get_map().await.map_err(status)?;
        Ok(Response::new(pb::GetMapResponse {
            map: encode_map(&map),
        }))
    }

    async fn changes_since(
        &self,
        req: Request<pb::ChangesSinceRequest>,
    ) -> Result<Response<pb::MapUpdate>, Status> {
        let since = MapVersion(req.into_inner().since);
        let update = self.store.changes_since(since).await.map_err(status)?;
        Ok(Response::new(update_to_pb(&update)))
    }

    type WatchStream = WatchStream;

    async fn watch(&self, req: Request<pb::WatchRequest>) -> Result<Response<WatchStream>, Status> {
        let since = MapVersion(req.into_inner().since);
        let updates = self.store.watch(since).await.map_err(status)?;
        let stop = Box::pin(stopping(self.stop.clone()));
        let stream = futures::stream::unfold(Some((updates, stop)), |state| async move {
            let (mut updates, mut stop) = state?;
            tokio::select! {
                item = updates.next() => match item {
                    Some(Ok(u)) => Some((Ok(update_to_pb(&u)), Some((updates, stop)))),
                    Some(Err(e)) => Some((Err(status(e)), None)),
                    None => None,
                },
                _ = &mut stop => Some((Err(shutting_down()), None)),
            }
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn commit(
        &self,
        req: Request<pb::CommitRequest>,
    ) -> Result<Response<pb::CommitResponse>, Status> {
        let txn = txn_from_pb(req.into_inner()).map_err(status)?;
        let version = self.store.commit(txn).await.map_err(status)?;
        Ok(Response::new(pb::CommitResponse { version: version.0 }))
    }

    async fn commit_with_migration(
        &self,
        req: Request<pb::CommitWithMigrationRequest>,
    ) -> Result<Response<pb::CommitResponse>, Status> {
        let req = req.into_inner();
        let missing = |what: &str| {
            status(MetaError::InvalidArgument(format!(
                "CommitWithMigration without {what}"
            )))
        };
        let txn = txn_from_pb(req.commit.ok_or_else(|| missing("a commit"))?).map_err(status)?;
        let m = req.migration.ok_or_else(|| missing("a migration record"))?;
        let put = crate::MigrationPut {
            id: m.id,
            expected: m.expected,
            generation: m.generation,
            record: m.record,
        };
        let version = self
            .store
            .commit_with_migration(txn, put)
            .await
            .map_err(status)?;
        Ok(Response::new(pb::CommitResponse { version: version.0 }))
    }

    async fn register_node(
        &self,
        req: Request<pb::RegisterNodeRequest>,
    ) -> Result<Response<pb::RegisterNodeResponse>, Status> {
        let req = req.into_inner();
        let id = self
            .store
            .register_node_in_zone(req.id.map(NodeId), req.resp_addr, req.admin_addr, req.zone)
            .await
            .map_err(status)?;
        Ok(Response::new(pb::RegisterNodeResponse { id: id.0 }))
    }

    async fn grant_lease(
        &self,
        req: Request<pb::GrantLeaseRequest>,
    ) -> Result<Response<pb::GrantLeaseResponse>, Status> {
        let req = req.into_inner();
        let lease = self
            .store
            .grant_lease(NodeId(req.node), req.ttl_ms)
            .await
            .map_err(status)?;
        Ok(Response::new(pb::GrantLeaseResponse { lease: lease.0 }))
    }

    async fn keep_alive(
        &self,
        req: Request<pb::KeepAliveRequest>,
    ) -> Result<Response<pb::KeepAliveResponse>, Status> {
        let lease = crate::LeaseId(req.into_inner().lease);
        let ttl_ms = self.store.keep_alive(lease).await.map_err(status)?;
        Ok(Response::new(pb::KeepAliveResponse { ttl_ms }))
    }

    async fn revoke_lease(
        &self,
        req: Request<pb::RevokeLeaseRequest>,
    ) -> Result<Response<pb::RevokeLeaseResponse>, Status> {
        let lease = crate::LeaseId(req.into_inner().lease);
        self.store.revoke_lease(lease).await.map_err(status)?;
        Ok(Response::new(pb::RevokeLeaseResponse {}))
    }

    async fn leases(
        &self,
        _: Request<pb::LeasesRequest>,
    ) -> Result<Response<pb::LeasesResponse>, Status> {
        let leases = self.store.leases().await.map_err(status)?;
        Ok(Response::new(pb::LeasesResponse {
            leases: leases.iter().map(lease_to_pb).collect(),
        }))
    }

    async fn bootstrap_if_empty(
        &self,
        req: Request<pb::BootstrapIfEmptyRequest>,
    ) -> Result<Response<pb::BootstrapIfEmptyResponse>, Status> {
        let req = req.into_inner();
        let min_nodes = usize::try_from(req.min_nodes).unwrap_or(usize::MAX);
        let per_node = u16::try_from(req.partitions_per_node).map_err(|_| {
            status(MetaError::InvalidArgument(format!(
                "partitions_per_node {} exceeds {}",
                req.partitions_per_node,
                u16::MAX
            )))
        })?;
        // 0 (a client from before replication) means 1.
        let setting = |v: u32, what: &str| {
            u8::try_from(v.max(1)).map_err(|_| {
                status(MetaError::InvalidArgument(format!(
                    "{what} {v} exceeds 255"
                )))
            })
        };
        let replication = crate::Replication {
            factor: setting(req.replication_factor, "replication_factor")?,
            min_in_sync: setting(req.min_in_sync, "min_in_sync")?,
        };
        let bootstrapped = self
            .store
            .bootstrap_if_empty_with(min_nodes, per_node, replication)
            .await
            .map_err(status)?;
        Ok(Response::new(pb::BootstrapIfEmptyResponse { bootstrapped }))
    }

    async fn grant_session_lease(
        &self,
        req: Request<pb::GrantSessionLeaseRequest>,
    ) -> Result<Response<pb::GrantLeaseResponse>, Status> {
        let ttl_ms = req.into_inner().ttl_ms;
        let lease = self
            .store
            .grant_session_lease(ttl_ms)
            .await
            .map_err(status)?;
        Ok(Response::new(pb::GrantLeaseResponse { lease: lease.0 }))
    }

    async fn campaign(
        &self,
        req: Request<pb::CampaignRequest>,
    ) -> Result<Response<pb::CampaignResponse>, Status> {
        let req = req.into_inner();
        // If the client goes away, hyper drops this future, and with it the
        // store's campaign call, which withdraws the waiting candidacy.
        let won = tokio::select! {
            biased;
            won = self.store.campaign(&req.election, &req.candidate, LeaseId(req.lease)) => won,
            _ = stopping(self.stop.clone()) => return Err(shutting_down()),
        };
        let leadership = won.map_err(status)?;
        Ok(Response::new(pb::CampaignResponse {
            leadership: Some(leadership_to_pb(&leadership)),
        }))
    }

    async fn leader(
        &self,
        req: Request<pb::LeaderRequest>,
    ) -> Result<Response<pb::LeaderResponse>, Status> {
        let election = req.into_inner().election;
        let leader = self.store.leader(&election).await.map_err(status)?;
        Ok(Response::new(pb::LeaderResponse {
            leader: leader.as_ref().map(leadership_to_pb),
        }))
    }

    type ObserveStream = ObserveStream;

    async fn observe(
        &self,
        req: Request<pb::ObserveRequest>,
    ) -> Result<Response<ObserveStream>, Status> {
        let election = req.into_inner().election;
        let leaders = self.store.observe(&election).await.map_err(status)?;
        let stop = Box::pin(stopping(self.stop.clone()));
        let stream = futures::stream::unfold(Some((leaders, stop)), |state| async move {
            let (mut leaders, mut stop) = state?;
            tokio::select! {
                item = leaders.next() => match item {
                    Some(Ok(leader)) => Some((
                        Ok(pb::LeaderResponse { leader: leader.as_ref().map(leadership_to_pb) }),
                        Some((leaders, stop)),
                    )),
                    Some(Err(e)) => Some((Err(status(e)), None)),
                    None => None,
                },
                _ = &mut stop => Some((Err(shutting_down()), None)),
            }
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn resign(
        &self,
        req: Request<pb::ResignRequest>,
    ) -> Result<Response<pb::ResignResponse>, Status> {
        let leadership = req.into_inner().leadership.ok_or_else(|| {
            status(MetaError::InvalidArgument(
                "resign needs the leadership".into(),
            ))
        })?;
        self.store
            .resign(&leadership_from_pb(leadership))
            .await
            .map_err(status)?;
        Ok(Response::new(pb::ResignResponse {}))
    }

    async fn allocate_migration_id(
        &self,
        _: Request<pb::AllocateMigrationIdRequest>,
    ) -> Result<Response<pb::AllocateMigrationIdResponse>, Status> {
        let id = self.store.allocate_migration_id().await.map_err(status)?;
        Ok(Response::new(pb::AllocateMigrationIdResponse { id }))
    }

    async fn put_migration(
        &self,
        req: Request<pb::PutMigrationRequest>,
    ) -> Result<Response<pb::PutMigrationResponse>, Status> {
        let req = req.into_inner();
        self.store
            .put_migration(req.id, req.expected, req.generation, req.record)
            .await
            .map_err(status)?;
        Ok(Response::new(pb::PutMigrationResponse {}))
    }

    async fn get_migration(
        &self,
        req: Request<pb::GetMigrationRequest>,
    ) -> Result<Response<pb::GetMigrationResponse>, Status> {
        let id = req.into_inner().id;
        let migration = self.store.get_migration(id).await.map_err(status)?;
        Ok(Response::new(pb::GetMigrationResponse {
            migration: migration.as_ref().map(migration_to_pb),
        }))
    }

    async fn migrations(
        &self,
        _: Request<pb::MigrationsRequest>,
    ) -> Result<Response<pb::MigrationsResponse>, Status> {
        let migrations = self.store.migrations().await.map_err(status)?;
        Ok(Response::new(pb::MigrationsResponse {
            migrations: migrations.iter().map(migration_to_pb).collect(),
        }))
    }

    async fn delete_migration(
        &self,
        req: Request<pb::DeleteMigrationRequest>,
    ) -> Result<Response<pb::DeleteMigrationResponse>, Status> {
        let req = req.into_inner();
        self.store
            .delete_migration(req.id, req.expected)
            .await
            .map_err(status)?;
        Ok(Response::new(pb::DeleteMigrationResponse {}))
    }

    async fn acl_users(
        &self,
        _: Request<pb::AclUsersRequest>,
    ) -> Result<Response<pb::AclUsersResponse>, Status> {
        let users = self.store.acl_users().await.map_err(status)?;
        Ok(Response::new(pb::AclUsersResponse {
            users: users
                .into_iter()
                .map(|u| pb::AclRecord {
                    name: u.name,
                    rules: u.rules,
                })
                .collect(),
        }))
    }

    async fn put_acl_user(
        &self,
        req: Request<pb::PutAclUserRequest>,
    ) -> Result<Response<pb::PutAclUserResponse>, Status> {
        let Some(user) = req.into_inner().user else {
            return Err(Status::invalid_argument("PutAclUser without a user"));
        };
        self.store
            .put_acl_user(crate::AclRecord {
                name: user.name,
                rules: user.rules,
            })
            .await
            .map_err(status)?;
        Ok(Response::new(pb::PutAclUserResponse {}))
    }

    async fn delete_acl_user(
        &self,
        req: Request<pb::DeleteAclUserRequest>,
    ) -> Result<Response<pb::DeleteAclUserResponse>, Status> {
        let deleted = self
            .store
            .delete_acl_user(&req.into_inner().name)
            .await
            .map_err(status)?;
        Ok(Response::new(pb::DeleteAclUserResponse { deleted }))
    }
}

#[cfg(test)]
mod tests {
    use crate::{EmbeddedMeta, EmbeddedOptions, MetaError, MetaStore, RemoteMeta};
    use std::sync::Arc;
    use std::time::Duration;
    use tokio::net::TcpListener;

    const WAIT: Duration = Duration::from_secs(10);

    /// Serves the store in `dir` on a fresh port; returns a client, the stop
    /// trigger and the server task.
    async fn start(
        dir: &std::path::Path,
    ) -> (
        RemoteMeta,
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<Result<(), MetaError>>,
    ) {
        let store = EmbeddedMeta::open(dir, EmbeddedOptions::default()).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(super::serve(Arc::new(store), listener, async move {
            let _ = rx.await;
        }));
        (
            RemoteMeta::connect(&addr.to_string()).await.unwrap(),
            tx,
            task,
        )
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_waiting_campaign_does_not_hold_up_shutdown_and_the_seat_survives_it() {
        let dir = tempfile::tempdir().unwrap();
        let (client, stop, server) = start(dir.path()).await;
        let la = client.grant_session_lease(60_000).await.unwrap();
        let lb = client.grant_session_lease(60_000).await.unwrap();
        let a = client.campaign("e", "a", la).await.unwrap();
        let waiter = {
            let client = client.clone();
            tokio::spawn(async move { client.campaign("e", "b", lb).await })
        };
        // Not finished: b waits behind a (with no deadline of its own).
        let mut waiter = waiter;
        assert!(
            tokio::time::timeout(Duration::from_millis(300), &mut waiter)
                .await
                .is_err()
        );
        stop.send(()).unwrap();
        let ended = tokio::time::timeout(WAIT, waiter).await.unwrap().unwrap();
        assert!(matches!(ended, Err(MetaError::Unavailable(_))), "{ended:?}");
        tokio::time::timeout(WAIT, server)
            .await
            .expect("shutdown is not held up by the waiting campaign")
            .unwrap()
            .unwrap();

        // The store reopens with a still leading; b campaigns again and wins
        // when a resigns.
        let (client, _stop, _server) = loop {
            // The previous store may still be releasing its lock.
            if let Ok(store) = EmbeddedMeta::open(dir.path(), EmbeddedOptions::default()) {
                drop(store);
                break start(dir.path()).await;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        assert_eq!(client.leader("e").await.unwrap(), Some(a.clone()));
        let b = {
            let client = client.clone();
            tokio::spawn(async move { client.campaign("e", "b", lb).await })
        };
        client.resign(&a).await.unwrap();
        let b = tokio::time::timeout(WAIT, b)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(client.leader("e").await.unwrap(), Some(b));
    }
}
