//! The access log's tests: the writer's flushes and torn writes, and both record formats.

use super::*;

fn record(format: LogFormat) -> AccessRecord {
    AccessRecord {
        rule: None,
        network: None,
        format,
        time: 1_767_225_600 * NANOS_PER_SEC + 123_456_789,
        request_id: "abc-1".into(),
        client: Some("key:3f2a9c01…".into()),
        ip: "203.0.113.9".parse().unwrap(),
        method: Method::POST,
        path: "/login\"x".into(),
        version: Version::HTTP_11,
        route: Some("login".into()),
        status: 429,
        decision: Decision::Rejected,
        limiter: Some("strict".into()),
        retry_after: Some(40),
        upstream: None,
        upstream_ms: None,
        error_origin: Some(Origin::Downstream),
        duration_ms: 0.41234,
        bytes_out: 231,
        referer: None,
        user_agent: Some(HeaderValue::from_static("curl/8 \"evil\"")),
    }
}

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);
impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn flush_returns_once_every_record_queued_before_it_is_written() {
    let out = Capture::default();
    let log = AccessLog::new(Box::new(out.clone()), QUEUE);
    for _ in 0..3 {
        log.send(record(LogFormat::Text));
    }
    assert!(log.flush(std::time::Duration::from_secs(5)));
    let text = String::from_utf8(out.0.lock().clone()).unwrap();
    assert_eq!(text.lines().count(), 3, "{text}");
    // And again: the writer rests after a batch, it does not stop.
    log.send(record(LogFormat::Json));
    assert!(log.flush(std::time::Duration::from_secs(5)));
    assert_eq!(out.0.lock().split(|&b| b == b'\n').count(), 5);
}

/// A disk with room for `room` more bytes.
struct Disk {
    written: Vec<u8>,
    room: usize,
}
impl Write for Disk {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.room == 0 {
            return Err(std::io::Error::from_raw_os_error(28)); // ENOSPC
        }
        let n = buf.len().min(self.room);
        self.room -= n;
        self.written.extend_from_slice(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_write_cut_short_by_a_full_disk_is_ended_before_the_next_records() {
    let mut disk = Disk {
        written: Vec::new(),
        room: 12,
    };
    let mut torn = false;
    assert!(write_batch(&mut disk, "{\"a\":1}\n{\"b\":2}\n", &mut torn).is_err());
    assert!(torn);
    disk.room = 100;
    write_batch(&mut disk, "{\"c\":3}\n", &mut torn).unwrap();
    assert_eq!(disk.written, b"{\"a\":1}\n{\"b\"\n{\"c\":3}\n");
    // Cut right after a record: nothing to end.
    let mut disk = Disk {
        written: Vec::new(),
        room: 8,
    };
    assert!(write_batch(&mut disk, "{\"a\":1}\n{\"b\":2}\n", &mut torn).is_err());
    assert!(!torn);
}

#[test]
fn a_json_record_is_one_object_with_the_documented_fields() {
    let mut line = String::new();
    record(LogFormat::Json).format_into(&mut line);
    assert!(line.ends_with('\n') && line.matches('\n').count() == 1);
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["ts"], "2026-01-01T00:00:00.123Z");
    assert_eq!(v["request_id"], "abc-1");
    assert_eq!(v["status"], 429);
    assert_eq!(v["decision"], "rejected");
    assert_eq!(v["retry_after"], 40);
    assert_eq!(v["duration_ms"], 0.412);
    assert_eq!(v["proto"], "HTTP/1.1");
    assert_eq!(v["error_origin"], "downstream");
    assert!(v["upstream"].is_null());
}

#[test]
fn hand_written_numbers_times_and_addresses_read_as_the_formatter_writes_them() {
    for ms in [0.0, 0.0004, 0.41234, 7.0, 12.3456, 99_999.999_1] {
        let mut out = String::new();
        push_millis(&mut out, ms);
        assert_eq!(out, format!("{ms:.3}"));
    }
    for ip in ["203.0.113.9", "0.0.0.0", "255.255.255.255", "2001:db8::1"] {
        let mut out = String::new();
        push_ip(&mut out, ip.parse().unwrap());
        assert_eq!(out, ip);
    }
    let mut out = String::new();
    push_clf_time(&mut out, 1_796_033_119 * NANOS_PER_SEC);
    assert_eq!(out, "30/Nov/2026:10:05:19 +0000");
}

#[test]
fn the_writer_reuses_a_seconds_time_text_only_within_that_second() {
    let mut times = ClfTime::default();
    let second = 1_796_033_119 * NANOS_PER_SEC;
    assert_eq!(times.of(second), "30/Nov/2026:10:05:19 +0000");
    assert_eq!(times.of(second + 999_999_999), "30/Nov/2026:10:05:19 +0000");
    assert_eq!(
        times.of(second + NANOS_PER_SEC),
        "30/Nov/2026:10:05:20 +0000"
    );
    assert_eq!(times.of(second), "30/Nov/2026:10:05:19 +0000");
    let (mut a, mut b) = (record(LogFormat::Text), record(LogFormat::Text));
    b.time += 86_400 * NANOS_PER_SEC;
    let mut lines = String::new();
    a.format_with(&mut lines, &mut times);
    b.format_with(&mut lines, &mut times);
    a.time = b.time;
    a.format_with(&mut lines, &mut times);
    let stamps: Vec<&str> = lines
        .lines()
        .map(|l| &l[l.find('[').unwrap()..][..28])
        .collect();
    assert_eq!(
        stamps,
        [
            "[01/Jan/2026:00:00:00 +0000]",
            "[02/Jan/2026:00:00:00 +0000]",
            "[02/Jan/2026:00:00:00 +0000]"
        ]
    );
}

#[test]
fn a_text_record_reads_like_nginx_combined_and_escapes_quotes() {
    let mut line = String::new();
    record(LogFormat::Text).format_into(&mut line);
    assert_eq!(
        line,
        "203.0.113.9 - key:3f2a9c01… [01/Jan/2026:00:00:00 +0000] \"POST /login\\x22x HTTP/1.1\" 429 231 \"-\" \"curl/8 \\x22evil\\x22\" rid=abc-1 route=login decision=rejected limiter=strict retry_after=40 upstream=- upstream_ms=- duration_ms=0.412 error_origin=downstream\n"
    );
}

#[test]
fn a_records_network_is_logged_only_when_geoip_looked_it_up() {
    let plain = record(LogFormat::Text);
    let mut line = String::new();
    plain.format_into(&mut line);
    assert!(!line.contains("asn="), "{line}");
    let mut r = record(LogFormat::Text);
    r.network = Some(crate::geodb::Network {
        asn: Some(64500),
        country: crate::geodb::Country::parse("DE"),
    });
    let mut line = String::new();
    r.format_into(&mut line);
    assert!(line.ends_with(" asn=64500 country=DE\n"), "{line}");
    r.format = LogFormat::Json;
    r.network = Some(crate::geodb::Network::default());
    let mut json = String::new();
    r.format_into(&mut json);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["asn"], serde_json::Value::Null);
    assert!(v.as_object().unwrap().contains_key("country"));
}
