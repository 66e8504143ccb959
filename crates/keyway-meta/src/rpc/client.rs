//! [`RemoteMeta`]: a [`MetaStore`] that calls a `keyway meta` server.
//!
//! The channel is lazy and reconnecting: creating a client never fails for an
//! unreachable server, and a client outlives server restarts (the next call
//! after the server is back succeeds). Every call has a deadline
//! ([`RemoteOptions::rpc_timeout`], default 2 s); a call that misses it, or
//! fails in the transport, returns [`MetaError::Unavailable`], and for a
//! mutating call its outcome is then unknown (re-read before retrying).
//! A watch (or observe) stream is bounded only while it is being opened;
//! once open it lasts until the server ends it (HTTP/2 keep-alive pings
//! detect a vanished server) and then yields one `Unavailable` item and ends.
//! `campaign` has no deadline at all (it waits for the seat); keep-alive
//! pings bound how long it can hang on a vanished server, and dropping it
//! resets the call, which withdraws the waiting candidacy on the server.

use super::convert::{
    error_from_status, leadership_from_pb, leadership_to_pb, lease_from_pb, map_from_bytes,
    migration_from_pb, txn_to_pb, update_from_pb,
};
use super::pb::{self, meta_client::MetaClient};
use crate::{
    LeaderWatch, Leadership, LeaseId, LeaseInfo, MapTxn, MapUpdate, MapWatch, MetaError, MetaStore,
    MigrationPut, StoredMigration,
};
use futures::StreamExt;
use keyway_map::{MapVersion, NodeId, PartitionMap};
use std::time::Duration;
use tonic::transport::Endpoint;

/// Tuning of a [`RemoteMeta`].
#[derive(Clone, Debug)]
pub struct RemoteOptions {
    /// Deadline of every call (and of opening a connection); default 2 s.
    pub rpc_timeout: Duration,
    /// HTTP/2 keep-alive ping interval, and how long to wait for the answer
    /// before the connection is considered dead; default 5 s.
    pub keep_alive: Duration,
    /// The cluster secret every call carries; default the process's
    /// ([`keyway_auth::process_secret`]).
    pub secret: Option<keyway_auth::ClusterSecret>,
}

impl Default for RemoteOptions {
    fn default() -> Self {
        RemoteOptions {
            rpc_timeout: Duration::from_secs(2),
            keep_alive: Duration::from_secs(5),
            secret: keyway_auth::process_secret(),
        }
    }
}

/// A gRPC client of a metadata server; cheap to clone (clones share the
/// connection).
#[derive(Clone)]
pub struct RemoteMeta {
    client: MetaClient<keyway_auth::AuthChannel>,
    addr: String,
    opts: RemoteOptions,
}

impl std::fmt::Debug for RemoteMeta {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteMeta")
            .field("addr", &self.addr)
            .field("opts", &self.opts)
            .finish()
    }
}

impl RemoteMeta {
    /// A client of the server at `addr` (`host:port`, `keyway://host:port` or
    /// `http://host:port`) with default options. Does not connect yet.
    pub async fn connect(addr: &str) -> Result<Self, MetaError> {
        Self::connect_with(addr, RemoteOptions::default()).await
    }

    /// As [`Self::connect`], with options.
    pub async fn connect_with(addr: &str, opts: RemoteOptions) -> Result<Self, MetaError> {
        let hostport = addr
            .strip_prefix("keyway://")
            .or_else(|| addr.strip_prefix("http://"))
            .unwrap_or(addr)
            .trim_end_matches('/');
        if hostport.is_empty() || hostport.contains("://") || hostport.contains('/') {
            return Err(MetaError::InvalidArgument(format!(
                "metadata server address must be host:port or keyway://host:port, got {addr:?}"
            )));
        }
        let uri = format!("http://{hostport}");
        let endpoint = Endpoint::from_shared(uri)
            .map_err(|e| {
                MetaError::InvalidArgument(format!("metadata server address {addr:?}: {e}"))
            })?
            .connect_timeout(opts.rpc_timeout)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(opts.keep_alive)
            .keep_alive_timeout(opts.keep_alive)
            .keep_alive_while_idle(true);
        let channel = keyway_auth::auth_channel(endpoint.connect_lazy(), opts.secret.as_ref());
        let client = MetaClient::new(channel)
            .max_decoding_message_size(super::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(super::MAX_MESSAGE_BYTES);
        Ok(RemoteMeta {
            client,
            addr: hostport.to_string(),
            opts,
        })
    }

    /// The server's `host:port`.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Runs one call under the deadline, mapping every failure to a `MetaError`.
    async fn call<T, F, Fut>(&self, what: &str, f: F) -> Result<T, MetaError>
    where
        F: FnOnce(MetaClient<keyway_auth::AuthChannel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        match tokio::time::timeout(self.opts.rpc_timeout, f(self.client.clone())).await {
            Ok(Ok(resp)) => Ok(resp.into_inner()),
            Ok(Err(status)) if status.code() == tonic::Code::Unauthenticated => {
                Err(MetaError::Unauthenticated(keyway_auth::refused_message(
                    "metadata server",
                    &self.addr,
                    status.message(),
                )))
            }
            Ok(Err(status)) => Err(error_from_status(&status)),
            Err(_) => Err(MetaError::Unavailable(format!(
                "{what} to metadata server {} timed out after {:?}",
                self.addr, self.opts.rpc_timeout
            ))),
        }
    }

    fn request<T>(&self, msg: T) -> tonic::Request<T> {
        let mut req = tonic::Request::new(msg);
        // Lets the server give up when the client has.
        req.set_timeout(self.opts.rpc_timeout);
        req
    }
}

#[async_trait::async_trait]
impl MetaStore for RemoteMeta {
    async fn get_map(&self) -> Result<PartitionMap, MetaError> {
        let req = self.request(pb::GetMapRequest {});
        let resp = self
            .call("GetMap", |mut c| async move { c.get_map(req).await })
            .await?;
        map_from_bytes(&resp.map)
    }

    async fn changes_since(&self, since: MapVersion) -> Result<MapUpdate, MetaError> {
        let req = self.request(pb::ChangesSinceRequest { since: since.0 });
        let resp = self
            .call(
                "ChangesSince",
                |mut c| async move { c.changes_since(req).await },
            )
            .await?;
        update_from_pb(resp)
    }

    async fn watch(&self, since: MapVersion) -> Result<MapWatch, MetaError> {
        // No grpc-timeout on the stream itself: it lasts as long as it is read.
        let req = tonic::Request::new(pb::WatchRequest { since: since.0 });
        let streaming = self
            .call("Watch", |mut c| async move { c.watch(req).await })
            .await?;
        Ok(server_stream(
            streaming,
            self.addr.clone(),
            "watch",
            update_from_pb,
        ))
    }

    async fn commit(&self, txn: MapTxn) -> Result<MapVersion, MetaError> {
        let req = self.request(txn_to_pb(&txn));
        let resp = self
            .call("Commit", |mut c| async move { c.commit(req).await })
            .await?;
        Ok(MapVersion(resp.version))
    }

    async fn commit_with_migration(
        &self,
        txn: MapTxn,
        put: MigrationPut,
    ) -> Result<MapVersion, MetaError> {
        let req = self.request(pb::CommitWithMigrationRequest {
            commit: Some(txn_to_pb(&txn)),
            migration: Some(pb::PutMigrationRequest {
                id: put.id,
                expected: put.expected,
                generation: put.generation,
                record: put.record,
            }),
        });
        let resp = self
            .call("CommitWithMigration", |mut c| async move {
                c.commit_with_migration(req).await
            })
            .await?;
        Ok(MapVersion(resp.version))
    }

    async fn register_node_in_zone(
        &self,
        id: Option<NodeId>,
        resp_addr: String,
        admin_addr: String,
        zone: Option<String>,
    ) -> Result<NodeId, MetaError> {
        let req = self.request(pb::RegisterNodeRequest {
            id: id.map(|id| id.0),
            resp_addr,
            admin_addr,
            zone,
        });
        let resp = self
            .call(
                "RegisterNode",
                |mut c| async move { c.register_node(req).await },
            )
            .await?;
        Ok(NodeId(resp.id))
    }

    async fn grant_lease(&self, node: NodeId, ttl_ms: u64) -> Result<LeaseId, MetaError> {
        let req = self.request(pb::GrantLeaseRequest {
            node: node.0,
            ttl_ms,
        });
        let resp = self
            .call(
                "GrantLease",
                |mut c| async move { c.grant_lease(req).await },
            )
            .await?;
        Ok(LeaseId(resp.lease))
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<u64, MetaError> {
        let req = self.request(pb::KeepAliveRequest { lease: lease.0 });
        let resp = self
            .call("KeepAlive", |mut c| async move { c.keep_alive(req).await })
            .await?;
        Ok(resp.ttl_ms)
    }

    async fn revoke_lease(&self, lease: LeaseId) -> Result<(), MetaError> {
        let req = self.request(pb::RevokeLeaseRequest { lease: lease.0 });
        self.call(
            "RevokeLease",
            |mut c| async move { c.revoke_lease(req).await },
        )
        .await?;
        Ok(())
    }

    async fn leases(&self) -> Result<Vec<LeaseInfo>, MetaError> {
        let req = self.request(pb::LeasesRequest {});
        let resp = self
            .call("Leases", |mut c| async move { c.leases(req).await })
            .await?;
        Ok(resp.leases.into_iter().map(lease_from_pb).collect())
    }

    async fn bootstrap_if_empty_with(
        &self,
        min_nodes: usize,
        partitions_per_node: u16,
        replication: crate::Replication,
    ) -> Result<bool, MetaError> {
        let req = self.request(pb::BootstrapIfEmptyRequest {
            min_nodes: min_nodes as u64,
            partitions_per_node: partitions_per_node.into(),
            replication_factor: replication.factor.into(),
            min_in_sync: replication.min_in_sync.into(),
        });
        let resp = self
            .call("BootstrapIfEmpty", |mut c| async move {
                c.bootstrap_if_empty(req).await
            })
            .await?;
        Ok(resp.bootstrapped)
    }

    async fn grant_session_lease(&self, ttl_ms: u64) -> Result<LeaseId, MetaError> {
        let req = self.request(pb::GrantSessionLeaseRequest { ttl_ms });
        let resp = self
            .call("GrantSessionLease", |mut c| async move {
                c.grant_session_lease(req).await
            })
            .await?;
        Ok(LeaseId(resp.lease))
    }

    async fn campaign(
        &self,
        election: &str,
        candidate: &str,
        lease: LeaseId,
    ) -> Result<Leadership, MetaError> {
        // No deadline: the call waits as long as the seat is taken.
        let req = tonic::Request::new(pb::CampaignRequest {
            election: election.to_string(),
            candidate: candidate.to_string(),
            lease: lease.0,
        });
        let resp = self
            .client
            .clone()
            .campaign(req)
            .await
            .map_err(|status| error_from_status(&status))?
            .into_inner();
        resp.leadership.map(leadership_from_pb).ok_or_else(|| {
            MetaError::Internal("metadata server answered a campaign without the leadership".into())
        })
    }

    async fn leader(&self, election: &str) -> Result<Option<Leadership>, MetaError> {
        let req = self.request(pb::LeaderRequest {
            election: election.to_string(),
        });
        let resp = self
            .call("Leader", |mut c| async move { c.leader(req).await })
            .await?;
        Ok(resp.leader.map(leadership_from_pb))
    }

    async fn observe(&self, election: &str) -> Result<LeaderWatch, MetaError> {
        // No grpc-timeout on the stream itself: it lasts as long as it is read.
        let req = tonic::Request::new(pb::ObserveRequest {
            election: election.to_string(),
        });
        let streaming = self
            .call("Observe", |mut c| async move { c.observe(req).await })
            .await?;
        Ok(server_stream(
            streaming,
            self.addr.clone(),
            "observation",
            |resp: pb::LeaderResponse| Ok(resp.leader.map(leadership_from_pb)),
        ))
    }

    async fn resign(&self, leadership: &Leadership) -> Result<(), MetaError> {
        let req = self.request(pb::ResignRequest {
            leadership: Some(leadership_to_pb(leadership)),
        });
        self.call("Resign", |mut c| async move { c.resign(req).await })
            .await?;
        Ok(())
    }

    async fn allocate_migration_id(&self) -> Result<u64, MetaError> {
        let req = self.request(pb::AllocateMigrationIdRequest {});
        let resp = self
            .call("AllocateMigrationId", |mut c| async move {
                c.allocate_migration_id(req).await
            })
            .await?;
        Ok(resp.id)
    }

    async fn put_migration(
        &self,
        id: u64,
        expected: Option<u64>,
        generation: u64,
        record: Vec<u8>,
    ) -> Result<(), MetaError> {
        let req = self.request(pb::PutMigrationRequest {
            id,
            expected,
            generation,
            record,
        });
        self.call(
            "PutMigration",
            |mut c| async move { c.put_migration(req).await },
        )
        .await?;
        Ok(())
    }

    async fn get_migration(&self, id: u64) -> Result<Option<StoredMigration>, MetaError> {
        let req = self.request(pb::GetMigrationRequest { id });
        let resp = self
            .call(
                "GetMigration",
                |mut c| async move { c.get_migration(req).await },
            )
            .await?;
        Ok(resp.migration.map(migration_from_pb))
    }

    async fn migrations(&self) -> Result<Vec<StoredMigration>, MetaError> {
        let req = self.request(pb::MigrationsRequest {});
        let resp = self
            .call("Migrations", |mut c| async move { c.migrations(req).await })
            .await?;
        Ok(resp.migrations.into_iter().map(migration_from_pb).collect())
    }

    async fn delete_migration(&self, id: u64, expected: u64) -> Result<(), MetaError> {
        let req = self.request(pb::DeleteMigrationRequest { id, expected });
        self.call("DeleteMigration", |mut c| async move {
            c.delete_migration(req).await
        })
        .await?;
        Ok(())
    }

    async fn acl_users(&self) -> Result<Vec<crate::AclRecord>, MetaError> {
        let req = self.request(pb::AclUsersRequest {});
        let resp = self
            .call("AclUsers", |mut c| async move { c.acl_users(req).await })
            .await?;
        Ok(resp
            .users
            .into_iter()
            .map(|u| crate::AclRecord {
                name: u.name,
                rules: u.rules,
            })
            .collect())
    }

    async fn put_acl_user(&self, record: crate::AclRecord) -> Result<(), MetaError> {
        let req = self.request(pb::PutAclUserRequest {
            user: Some(pb::AclRecord {
                name: record.name,
                rules: record.rules,
            }),
        });
        self.call(
            "PutAclUser",
            |mut c| async move { c.put_acl_user(req).await },
        )
        .await?;
        Ok(())
    }

    async fn delete_acl_user(&self, name: &str) -> Result<bool, MetaError> {
        let req = self.request(pb::DeleteAclUserRequest {
            name: name.to_string(),
        });
        let resp = self
            .call("DeleteAclUser", |mut c| async move {
                c.delete_acl_user(req).await
            })
            .await?;
        Ok(resp.deleted)
    }
}

/// Turns a gRPC server stream into our item stream: each message converted
/// by `convert`; the end of the stream or a transport error is one final
/// `Unavailable` (or the error the server sent), after which it ends.
fn server_stream<M, T>(
    streaming: tonic::Streaming<M>,
    addr: String,
    what: &'static str,
    convert: fn(M) -> Result<T, MetaError>,
) -> std::pin::Pin<Box<dyn futures::Stream<Item = Result<T, MetaError>> + Send>>
where
    M: Send + 'static,
    T: Send + 'static,
{
    futures::stream::unfold(Some(streaming), move |state| {
        let addr = addr.clone();
        async move {
            let mut streaming = state?;
            match streaming.message().await {
                Ok(Some(message)) => match convert(message) {
                    Ok(item) => Some((Ok(item), Some(streaming))),
                    Err(e) => Some((Err(e), None)),
                },
                Ok(None) => Some((
                    Err(MetaError::Unavailable(format!(
                        "metadata server {addr} ended the {what}"
                    ))),
                    None,
                )),
                Err(status) => Some((Err(error_from_status(&status)), None)),
            }
        }
    })
    .boxed()
}
