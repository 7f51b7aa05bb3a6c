//! A NUL byte (`%00`) in a `/v1` id or query value is the request's fault: a 400 in the
//! envelope before any store is asked, standalone and `serve` on Postgres (which refuses the
//! byte in text, an error that read as an outage: 503 "retry with backoff").

use e2e::*;

async fn a_nul_byte_in_an_id_or_a_query_is_a_400(gw: &Gateway) {
    let key = gw.new_key(1_000_000, &KeySpec::tier("pay_as_you_go")).await;
    for path in [
        "/v1/responses/resp_%00x",
        "/v1/responses/resp_x%00/input_items",
        "/v1/files/file-%00",
        "/v1/messages/batches/msgbatch_%00",
        "/v1/batches/batch_%00",
        "/v1/files?after=file-%00",
        "/v1/messages/batches?after_id=msgbatch_%00",
    ] {
        let message = gw
            .get(path, &key.secret)
            .await
            .expect_error(400, "invalid_request_error");
        assert!(message.contains("NUL"), "{path}: {message}");
    }
}

#[tokio::test]
async fn standalone_a_nul_byte_in_an_id_or_a_query_is_a_400() {
    let gw = Gateway::start().await;
    a_nul_byte_in_an_id_or_a_query_is_a_400(&gw).await;
}

#[tokio::test]
async fn in_postgres_a_nul_byte_in_an_id_or_a_query_is_a_400() {
    let pg = PostgresServer::start().await;
    let cluster = Cluster::start(1, |b| b.database(&pg.url())).await;
    a_nul_byte_in_an_id_or_a_query_is_a_400(&cluster.pods[0]).await;
}
