//! The client side: [`SecretInterceptor`] adds `Authorization: Bearer
//! <secret>` to every gRPC call of a channel ([`AuthChannel`]), and
//! [`refused_message`] turns a guard's refusal into an error line that says
//! what to fix.

use crate::ClusterSecret;
use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

/// Adds the secret (if any) to every request.
#[derive(Clone, Debug, Default)]
pub struct SecretInterceptor {
    value: Option<AsciiMetadataValue>,
}

impl SecretInterceptor {
    /// An interceptor sending `secret` (none: sends nothing).
    pub fn new(secret: Option<&ClusterSecret>) -> Self {
        SecretInterceptor {
            value: secret.map(|s| {
                MetadataValue::try_from(s.bearer()).expect("a checked secret is a valid header")
            }),
        }
    }
}

impl Interceptor for SecretInterceptor {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.value {
            req.metadata_mut().insert("authorization", value.clone());
        }
        Ok(req)
    }
}

/// A channel whose calls carry the cluster secret.
pub type AuthChannel = InterceptedService<Channel, SecretInterceptor>;

/// `channel` with `secret` added to every call.
pub fn auth_channel(channel: Channel, secret: Option<&ClusterSecret>) -> AuthChannel {
    InterceptedService::new(channel, SecretInterceptor::new(secret))
}

/// The `Authorization` header line value for an HTTP call, if a secret is set.
pub fn authorization(secret: Option<&ClusterSecret>) -> Option<String> {
    secret.map(ClusterSecret::bearer)
}

/// "the {what} at {addr} refused this process: wrong or missing cluster
/// secret (--cluster-secret-file): {server's reason}".
pub fn refused_message(what: &str, addr: &str, detail: &str) -> String {
    format!(
        "the {what} at {addr} refused this process: wrong or missing cluster secret \
         (--cluster-secret-file): {detail}"
    )
}
