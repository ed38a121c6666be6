//! The tonic `Watch` service: resolves each stream's tenant through the frontend's
//! [`WatchSource`] and spawns one stream task per call.

use std::pin::Pin;
use std::sync::Arc;

use api::etcdserverpb::watch_server::Watch;
use api::etcdserverpb::{WatchRequest, WatchResponse};
use futures::Stream;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status, Streaming};

use super::{
    OUTPUT_BUFFER, OUTPUT_BYTES, Output, OutputBytes, WatchConfig, WatchSource, WatchTarget,
    output_channel, run_stream,
};

/// etcd's `Watch` service over the frontend's tenants.
pub struct WatchService<S: WatchSource> {
    source: Arc<S>,
    config: WatchConfig,
}

impl<S: WatchSource> WatchService<S> {
    /// A service with etcd's defaults.
    pub fn new(source: Arc<S>) -> Self {
        Self::with_config(source, WatchConfig::default())
    }

    /// A service with explicit settings (progress interval, fragment size, catch-up batch).
    pub fn with_config(source: Arc<S>, config: WatchConfig) -> Self {
        Self { source, config }
    }
}

pub type ResponseStream =
    Pin<Box<dyn Stream<Item = Result<WatchResponse, Status>> + Send + 'static>>;

impl<S: WatchSource> WatchService<S> {
    /// A watch stream over any source of requests: the gRPC call's, or the JSON gateway's
    /// (`crate::gateway`).
    pub async fn open<I>(&self, metadata: MetadataMap, input: I) -> Result<ResponseStream, Status>
    where
        I: Stream<Item = Result<WatchRequest, Status>> + Unpin + Send + 'static,
    {
        let target = self.source.resolve(&metadata).await?;
        self.open_for(target, metadata, input)
    }

    /// `open` of a stream whose tenant is resolved.
    fn open_for<I>(
        &self,
        target: WatchTarget,
        metadata: MetadataMap,
        input: I,
    ) -> Result<ResponseStream, Status>
    where
        I: Stream<Item = Result<WatchRequest, Status>> + Unpin + Send + 'static,
    {
        let (source, md) = (self.source.clone(), metadata.clone());
        let (tx, rx) = output_channel(&metadata, OUTPUT_BUFFER, move || source.has_leader(&md))?;
        let bytes = OutputBytes::new(OUTPUT_BYTES);
        let output = Output {
            tx,
            bytes: bytes.clone(),
        };
        tokio::spawn(run_stream(target, self.config.clone(), input, output));
        Ok(Box::pin(bytes.stream(rx)))
    }
}

#[tonic::async_trait]
impl<S: WatchSource> Watch for WatchService<S> {
    type WatchStream = ResponseStream;

    async fn watch(
        &self,
        request: Request<Streaming<WatchRequest>>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let (metadata, _, input) = request.into_parts();
        self.open(metadata, input).await.map(Response::new)
    }
}
