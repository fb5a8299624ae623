//! A chunk's remote batch as the ledger records it: the request id and the provider's references (file ids, a
//! results URL), read for a resumed submit, which reuses what an interrupted one created.

use super::*;

impl Store {
    /// The chunk's recorded request id and remote references (`c<i>:request_id`, `c<i>:remote`), each `None`
    /// when absent.
    pub async fn chunk_remote(&self, chunk: &ChunkRef) -> Result<(Option<String>, Option<String>), StoreError> {
        let names =
            [field::chunk(chunk.index, field::CHUNK_REQUEST_ID), field::chunk(chunk.index, field::CHUNK_REMOTE)];
        let values: Vec<Option<String>> = redis::cmd("HMGET")
            .arg(self.keys.job(&chunk.job_id))
            .arg(&names[..])
            .query_async(&mut self.conn.clone())
            .await?;
        let mut values = values.into_iter();
        Ok((values.next().flatten(), values.next().flatten()))
    }
}
