//! compactor's work on one request stops when its client leaves and when the process is told to
//! stop: measured in CPU time and wall time of the real binary, so these run one at a time.

use std::io::Write;
use std::time::{Duration, Instant};

use crate::common::*;

const AUTH: (&str, &str) = ("authorization", "Bearer sk-test");

#[tokio::test]
async fn a_client_that_leaves_stops_compactors_work_on_its_request() {
    let _machine = crate::one_at_a_time();
    let (fake, proxy) = ProxyProcess::with_fake("[limits]\nrewrite_budget_ms = 600000\n").await;
    // The tokenizer's tables load once, on first use, and that cannot be abandoned half-way: load
    // them first, so what is measured is the work on the request.
    let warm_up = send(request("POST", &proxy.url("/v1/chat/completions"), &[AUTH], chat_body(false))).await;
    assert_eq!(warm_up.status, 200);
    let body = chat_with_many_outputs(12 << 20);
    let mut stream = std::net::TcpStream::connect(proxy.addr).unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body.as_bytes()).unwrap();
    // compactor is busy counting; the client gives up.
    tokio::time::sleep(Duration::from_millis(500)).await;
    drop(stream);
    proxy.wait_for_log("outcome=client_gone").await;
    let stopped = cpu_time(proxy.pid());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle = cpu_time(proxy.pid()) - stopped;
    assert!(idle < Duration::from_millis(300), "compactor kept working for a client that left: {idle:?} of CPU");
    assert_eq!(fake.received().len(), 1, "nothing but the warm-up went upstream");
}

#[tokio::test]
async fn sigterm_ends_the_process_by_the_drain_deadline_even_while_a_long_rewrite_runs() {
    let _machine = crate::one_at_a_time();
    let (_fake, mut proxy) =
        ProxyProcess::with_fake("[limits]\nrewrite_budget_ms = 600000\n[shutdown]\ndrain_timeout_ms = 500\n").await;
    let body = chat_with_many_outputs(12 << 20);
    let url = proxy.url("/v1/chat/completions");
    let pending = tokio::spawn(async move { client().request(request("POST", &url, &[AUTH], body)).await });
    // Wait until compactor is at work on it (CPU climbing), then ask it to stop.
    let before = cpu_time(proxy.pid());
    let deadline = Instant::now() + Duration::from_secs(20);
    while cpu_time(proxy.pid()) < before + Duration::from_millis(500) {
        assert!(Instant::now() < deadline, "compactor never started on the request");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let asked = Instant::now();
    proxy.terminate();
    let code = proxy.wait_exit(Duration::from_secs(10));
    let took = asked.elapsed();
    assert_eq!(code, Some(0));
    assert!(took < Duration::from_millis(2_500), "the process took {took:?} to exit after SIGTERM");
    pending.abort();
}
