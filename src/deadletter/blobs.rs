//! The dead-letter container, through `object_store`'s Azure backend: the
//! sweep's seam to Blob Storage, like the guard's to Redis and the store's
//! to SQL. It lists, reads, and moves blobs; a move is a conditional put of
//! the blob's bytes under its new name (`PutMode::Create`: it fails if that
//! name exists) and then a delete of the old one, so two sweeps moving one
//! blob at once write it once and both see it moved.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::azure::{AzureCredential, AzureCredentialProvider, MicrosoftAzureBuilder};
use object_store::path::Path;
use object_store::{
    ClientOptions, CredentialProvider, ObjectStore, ObjectStoreExt, PutMode, PutOptions,
    PutPayload, RetryConfig, WriteMultipart,
};
use tokio::sync::Mutex;

use super::DeadLetterSettings;
use crate::storage::Credential;

/// Each request to Blob Storage is bounded by this (retries included).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// A block of a streamed copy ([`Container::move_unread`]), and how many
/// are uploaded at once: what the copy holds in memory.
const COPY_CHUNK_BYTES: usize = 4 * 1024 * 1024;
const COPY_PARTS_IN_FLIGHT: usize = 2;

/// A blob name as the object store's path, exactly as listed.
/// `Path::from` percent-encodes characters such as `%` or `#`, which would
/// name another blob than the one listed; `Path::parse` keeps the text (a
/// listed name always parses: the listing made it).
fn path(name: &str) -> Path {
    Path::parse(name).unwrap_or_else(|_| Path::from(name))
}

/// The Entra ID scope of Blob Storage.
const STORAGE_SCOPE: &str = "https://storage.azure.com/.default";

/// A Blob Storage failure, with what to check; never a key or a SAS.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BlobError(pub String);

/// One blob as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub name: String,
    pub size: u64,
}

/// What a bounded read found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Read {
    /// The whole blob, within the bound.
    Bytes(Bytes),
    /// No blob of that name (another sweep moved it).
    Gone,
    /// Larger than the bound (`size`: its size, or at least that much when
    /// it grew while being read); nothing more of it was read.
    TooLarge { size: u64 },
}

/// What a move found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Moved {
    /// This call wrote the copy (the conditional write only one sweep wins)
    /// and the original is gone.
    Now,
    /// Another sweep had moved it (or was moving it) already.
    Already,
}

/// The dead-letter container.
#[derive(Debug, Clone)]
pub struct Container {
    store: Arc<dyn ObjectStore>,
    /// `<account>/<container>`, for messages.
    described: String,
    /// The largest blob [`Container::read`] reads.
    max_blob_bytes: u64,
}

impl Container {
    /// A client for the container; sends nothing yet.
    pub fn open(settings: &DeadLetterSettings) -> Result<Container, BlobError> {
        crate::tls::install_crypto_provider();
        let target = &settings.storage;
        let options = ClientOptions::new()
            .with_timeout(REQUEST_TIMEOUT)
            .with_connect_timeout(Duration::from_secs(5))
            .with_allow_http(target.endpoint.starts_with("http://"));
        let retry = RetryConfig {
            max_retries: 3,
            retry_timeout: REQUEST_TIMEOUT,
            ..RetryConfig::default()
        };
        let mut builder = MicrosoftAzureBuilder::new()
            .with_account(&target.account)
            .with_container_name(&settings.container)
            .with_endpoint(target.endpoint.clone())
            .with_client_options(options)
            .with_retry(retry);
        builder = match &target.credential {
            Credential::AccountKey(k) => builder.with_access_key(k.expose()),
            Credential::Sas(s) => builder.with_sas_authorization(
                object_store::azure::split_sas(s.expose()).map_err(|_| {
                    BlobError("DEAD_LETTER_STORAGE: the shared access signature is not a URL query (sv=…&sig=…)".into())
                })?,
            ),
            Credential::EntraId { client_id } => {
                builder.with_credentials(entra_id(client_id.clone()))
            }
        };
        let store = builder.build().map_err(|e| {
            BlobError(format!(
                "DEAD_LETTER_STORAGE: cannot make a Blob Storage client: {}",
                scrub(&e.to_string())
            ))
        })?;
        Ok(Container {
            store: Arc::new(store),
            described: format!(
                "{}/{} ({})",
                target.account,
                settings.container,
                target.credential.kind()
            ),
            max_blob_bytes: settings.max_blob_bytes,
        })
    }

    /// The largest blob [`Container::read`] reads.
    pub fn max_blob_bytes(&self) -> u64 {
        self.max_blob_bytes
    }

    /// `<account>/<container> (<credential kind>)`, for logs.
    pub fn describe(&self) -> &str {
        &self.described
    }

    fn error(&self, what: &str, e: object_store::Error) -> BlobError {
        let hint = match &e {
            object_store::Error::NotFound { .. } => {
                "; check DEAD_LETTER_CONTAINER (the container must exist: it is the subscription's dead-letter destination)"
            }
            object_store::Error::PermissionDenied { .. }
            | object_store::Error::Unauthenticated { .. } => {
                "; the app's identity needs the Storage Blob Data Contributor role on the container (or check the key or SAS in DEAD_LETTER_STORAGE)"
            }
            _ => "",
        };
        BlobError(format!(
            "{what} in {}: {}{hint}",
            self.described,
            scrub(&e.to_string())
        ))
    }

    /// Every blob whose name starts with `prefix` (a folder: whole path
    /// segments), or every blob in the container.
    pub async fn list(&self, prefix: Option<&str>) -> Result<Vec<Listed>, BlobError> {
        let prefix = prefix.map(path);
        self.store
            .list(prefix.as_ref())
            .map_ok(|m| Listed {
                name: m.location.to_string(),
                size: m.size,
            })
            .try_collect()
            .await
            .map_err(|e| self.error("cannot list the blobs", e))
    }

    /// The top level: its folders (`<SUBSCRIPTION>/`, `<namespace>/`,
    /// `replayed/`, …) and the blobs at the root, outside any folder.
    pub async fn top_level(&self) -> Result<(Vec<String>, Vec<Listed>), BlobError> {
        let listed = self
            .store
            .list_with_delimiter(None)
            .await
            .map_err(|e| self.error("cannot list the folders", e))?;
        Ok((
            listed
                .common_prefixes
                .into_iter()
                .map(|p| p.to_string())
                .collect(),
            listed
                .objects
                .into_iter()
                .map(|m| Listed {
                    name: m.location.to_string(),
                    size: m.size,
                })
                .collect(),
        ))
    }

    /// A blob's bytes, read only while they fit the bound: its stated size
    /// is checked before any byte is read, and the stream is stopped at
    /// the bound in case the blob grew meanwhile.
    pub async fn read(&self, name: &str) -> Result<Read, BlobError> {
        let cannot = |e| self.error(&format!("cannot read {name}"), e);
        let got = match self.store.get(&path(name)).await {
            Ok(r) => r,
            Err(object_store::Error::NotFound { .. }) => return Ok(Read::Gone),
            Err(e) => return Err(cannot(e)),
        };
        let max = self.max_blob_bytes;
        if got.meta.size > max {
            return Ok(Read::TooLarge {
                size: got.meta.size,
            });
        }
        let mut body = bytes::BytesMut::with_capacity(got.meta.size as usize);
        let mut stream = got.into_stream();
        while let Some(chunk) = stream.try_next().await.map_err(cannot)? {
            if body.len() as u64 + chunk.len() as u64 > max {
                return Ok(Read::TooLarge {
                    size: body.len() as u64 + chunk.len() as u64,
                });
            }
            body.extend_from_slice(&chunk);
        }
        Ok(Read::Bytes(body.freeze()))
    }

    /// Whether a blob of that name exists.
    pub async fn exists(&self, name: &str) -> Result<bool, BlobError> {
        match self.store.head(&path(name)).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(self.error(&format!("cannot look up {name}"), e)),
        }
    }

    /// Write a blob only if its name is free; `false` when it exists.
    pub async fn put_new(&self, name: &str, bytes: Bytes) -> Result<bool, BlobError> {
        let options = PutOptions {
            mode: PutMode::Create,
            ..PutOptions::default()
        };
        match self
            .store
            .put_opts(&path(name), PutPayload::from(bytes), options)
            .await
        {
            Ok(_) => Ok(true),
            Err(object_store::Error::AlreadyExists { .. })
            | Err(object_store::Error::Precondition { .. }) => Ok(false),
            Err(e) => Err(self.error(&format!("cannot write {name}"), e)),
        }
    }

    /// Move `name` (whose content is `bytes`) under `folder`: write the copy
    /// if it is not there yet, then delete the original. Nothing is deleted
    /// unless the copy exists.
    pub async fn move_under(
        &self,
        folder: &str,
        name: &str,
        bytes: Bytes,
    ) -> Result<Moved, BlobError> {
        let to = format!("{folder}{name}");
        let wrote = self.put_new(&to, bytes).await?;
        self.delete_moved(name, &to).await?;
        // The conditional write succeeds for one sweep only: that one moved it.
        Ok(if wrote { Moved::Now } else { Moved::Already })
    }

    /// Move `name` (of `size` bytes, as listed) under `folder` without
    /// holding it: streamed from the original into a block upload of the
    /// copy, a chunk at a time (a few MiB in memory whatever its size),
    /// the copy checked to hold `size` bytes, then the original deleted.
    /// For a blob the sweep will not read whole. Not Blob Storage's own
    /// `Copy Blob`: that copy may still be pending when it answers (its
    /// destination already shows the full size), and deleting the source
    /// of a pending copy fails it. A block upload exists only once its
    /// block list is committed, whole.
    pub async fn move_unread(
        &self,
        folder: &str,
        name: &str,
        size: u64,
    ) -> Result<Moved, BlobError> {
        let to = format!("{folder}{name}");
        // A copy already there is whole (see above): another sweep's, or
        // this one's before a failed delete.
        let moved = if self.exists(&to).await? {
            Moved::Already
        } else {
            match self.stream_copy(name, &to).await? {
                true => Moved::Now,
                // The original is gone: another sweep moved it meanwhile.
                false if self.exists(&to).await? => return Ok(Moved::Already),
                false => {
                    return Err(BlobError(format!(
                        "{name} in {} is gone, and no copy {to} is there",
                        self.described
                    )))
                }
            }
        };
        let copy = self
            .store
            .head(&path(&to))
            .await
            .map_err(|e| self.error(&format!("cannot look up the copy {to}"), e))?;
        if copy.size != size {
            return Err(BlobError(format!(
                "the copy {to} in {} holds {} bytes, not the {size} listed of {name}: the original stays (the next sweep tries again)",
                self.described, copy.size
            )));
        }
        self.delete_moved(name, &to).await?;
        Ok(moved)
    }

    /// Stream `from` into a new block blob `to`; `false` when `from` is gone.
    async fn stream_copy(&self, from: &str, to: &str) -> Result<bool, BlobError> {
        let cannot = |e| self.error(&format!("cannot copy {from} to {to}"), e);
        let source = match self.store.get(&path(from)).await {
            Ok(r) => r,
            Err(object_store::Error::NotFound { .. }) => return Ok(false),
            Err(e) => return Err(cannot(e)),
        };
        let upload = self.store.put_multipart(&path(to)).await.map_err(cannot)?;
        let mut copy = WriteMultipart::new_with_chunk_size(upload, COPY_CHUNK_BYTES);
        let mut stream = source.into_stream();
        let streamed = async {
            while let Some(chunk) = stream.try_next().await? {
                copy.wait_for_capacity(COPY_PARTS_IN_FLIGHT).await?;
                copy.write(&chunk);
            }
            Ok::<_, object_store::Error>(())
        }
        .await;
        match streamed {
            Ok(()) => {
                copy.finish().await.map_err(cannot)?;
                Ok(true)
            }
            Err(e) => {
                // Uncommitted blocks are dropped by Blob Storage itself.
                let _ = copy.abort().await;
                Err(cannot(e))
            }
        }
    }

    /// Delete the original of a move whose copy `to` exists.
    async fn delete_moved(&self, name: &str, to: &str) -> Result<(), BlobError> {
        // NotFound: a sweep that found the copy already there deleted it.
        match self.store.delete(&path(name)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.error(
                &format!("copied {name} to {to} but cannot delete the original (the next sweep finishes the move)"),
                e,
            )),
        }
    }
}

/// Remove what could be a secret from an error text: a SAS signature and
/// any query string of a URL.
pub fn scrub(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find('?') {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| c.is_whitespace() || c == '"' || c == '\'' || c == ')')
            .unwrap_or(tail.len());
        if tail[..end].contains('=') {
            out.push_str("?(query not shown)");
        } else {
            out.push_str(&tail[..end]);
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

/// Entra ID tokens for Blob Storage from the same credential chain as
/// SQL's `Active Directory Default` (workload identity, the app's managed
/// identity, `az`/`azd` login, the Instance Metadata Service);
/// `client_id` names a user-assigned identity.
fn entra_id(client_id: Option<String>) -> AzureCredentialProvider {
    Arc::new(EntraId {
        chain: crate::entra::default_chain_credential(client_id, Duration::from_secs(10)),
        cached: Mutex::new(None),
    })
}

struct EntraId {
    chain: crate::entra::ChainCredential,
    cached: Mutex<Option<(Arc<AzureCredential>, azure_core::time::OffsetDateTime)>>,
}

impl std::fmt::Debug for EntraId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EntraId(Storage Blob Data Contributor token; not shown)")
    }
}

#[async_trait::async_trait]
impl CredentialProvider for EntraId {
    type Credential = AzureCredential;

    async fn get_credential(&self) -> object_store::Result<Arc<AzureCredential>> {
        use azure_core::credentials::TokenCredential;
        let mut cached = self.cached.lock().await;
        let margin = azure_core::time::Duration::seconds(300);
        if let Some((token, expires)) = cached.as_ref() {
            if *expires - margin > azure_core::time::OffsetDateTime::now_utc() {
                return Ok(Arc::clone(token));
            }
        }
        let token = self
            .chain
            .get_token(&[STORAGE_SCOPE], None)
            .await
            .map_err(|e| object_store::Error::Unauthenticated {
                path: String::new(),
                source: format!(
                    "no Entra ID token for Blob Storage ({}); on Azure enable a managed identity for the app and give it the Storage Blob Data Contributor role on the container; locally run `az login`",
                    scrub(&e.to_string())
                )
                .into(),
            })?;
        let credential = Arc::new(AzureCredential::BearerToken(
            token.token.secret().to_string(),
        ));
        *cached = Some((Arc::clone(&credential), token.expires_on));
        Ok(credential)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scrubbing_removes_queries_only() {
        assert_eq!(
            scrub("GET https://a.blob.core.windows.net/c/b?sv=1&sig=SECRET failed"),
            "GET https://a.blob.core.windows.net/c/b?(query not shown) failed"
        );
        assert_eq!(scrub("is it there? no"), "is it there? no");
        assert_eq!(scrub("plain"), "plain");
    }
}
