//! The access log's tests: the writer's flushes and torn writes, and both record formats.

use super::*;

fn record(format: LogFormat) -> AccessRecord {
    AccessRecord {
        rule: None,
        network: None,
        refusals: RefusalLog::Each,
        format,
        time: 1_767_225_600 * NANOS_PER_SEC + 123_456_789,
        request_id: RequestId::from_static("abc-1"),
        client: Some("key:3f2a9c01…".into()),
        ip: "203.0.113.9".parse().unwrap(),
        method: Method::POST,
        path: Some("/login\"x".into()),
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
    let log = AccessLog::new(Box::new(out.clone()), QUEUE, clock());
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

/// Two records, a third, and the second as a 12-byte disk cuts it. Named
/// here, not written in the test: the cut record's lone brace would make a
/// line counter that matches braces read past the test's end.
const TWO_RECORDS: &str = "{\"a\":1}\n{\"b\":2}\n";
const THIRD_RECORD: &str = "{\"c\":3}\n";
const SECOND_CUT: &str = "{\"b\"";

#[test]
fn a_write_cut_short_by_a_full_disk_is_ended_before_the_next_records() {
    let mut disk = Disk {
        written: Vec::new(),
        room: 12,
    };
    let mut torn = false;
    assert!(write_batch(&mut disk, TWO_RECORDS, &mut torn).is_err());
    assert!(torn);
    disk.room = 100;
    write_batch(&mut disk, THIRD_RECORD, &mut torn).unwrap();
    let first = &TWO_RECORDS[..8];
    let ended = [first, SECOND_CUT, "\n", THIRD_RECORD].concat();
    assert_eq!(disk.written, ended.as_bytes());
    // Cut right after a record: nothing to end.
    let mut disk = Disk {
        written: Vec::new(),
        room: 8,
    };
    assert!(write_batch(&mut disk, TWO_RECORDS, &mut torn).is_err());
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

fn clock() -> crate::clock::SharedClock {
    Arc::new(crate::clock::SystemClock)
}

/// A refusal of `client` at `secs` past the record's time, under `log.refusals: first`.
fn refusal(client: &str, secs: u64) -> AccessRecord {
    let mut r = record(LogFormat::Text);
    r.refusals = RefusalLog::First;
    r.client = Some(client.into());
    r.time += secs * NANOS_PER_SEC;
    r
}

/// Ends the windows over at `secs` past the records' time; the lines written.
fn end_at(windows: &mut refusals::Windows, secs: u64) -> Vec<String> {
    let mut out = String::new();
    let at = record(LogFormat::Text).time + secs * NANOS_PER_SEC;
    windows.end(at, &mut out, &mut ClfTime::default());
    out.lines().map(str::to_string).collect()
}

#[test]
fn a_clients_first_refusal_is_written_and_the_rest_of_its_window_is_one_summary_line() {
    let mut windows = refusals::Windows::default();
    assert!(windows.admit(&refusal("ip:203.0.113.9", 0)));
    for s in 1..40 {
        assert!(!windows.admit(&refusal("ip:203.0.113.9", s)), "second {s}");
    }
    // The window is its Retry-After (40 s): nothing ends before it.
    assert!(end_at(&mut windows, 39).is_empty());
    let lines = end_at(&mut windows, 40);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].starts_with("203.0.113.9 - ip:203.0.113.9 [01/Jan/2026:00:00:00 +0000] \"-\" 429 0 \"-\" \"-\" log=refusals route=login decision=rejected limiter=strict refusals=40 last=2026-01-01T00:00:39.123Z"),
        "{}",
        lines[0]
    );
    // After the window, the next refusal is written again and opens another.
    assert!(windows.admit(&refusal("ip:203.0.113.9", 41)));
    assert!(!windows.admit(&refusal("ip:203.0.113.9", 42)));
}

#[test]
fn a_client_refused_once_gets_no_summary_and_other_clients_have_windows_of_their_own() {
    let mut windows = refusals::Windows::default();
    assert!(windows.admit(&refusal("ip:a", 0)));
    assert!(windows.admit(&refusal("ip:b", 1)));
    assert!(!windows.admit(&refusal("ip:b", 2)));
    let lines = end_at(&mut windows, 3600);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains(" - ip:b [") && lines[0].contains("refusals=2"));
    assert_eq!(windows.len(), 0);
}

#[test]
fn under_each_and_for_every_answer_but_a_refusal_every_record_is_written() {
    let mut windows = refusals::Windows::default();
    let mut each = refusal("ip:a", 0);
    each.refusals = RefusalLog::Each;
    let mut allowed = refusal("ip:b", 0);
    allowed.decision = Decision::Allowed;
    allowed.status = 200;
    for _ in 0..3 {
        assert!(windows.admit(&each));
        assert!(windows.admit(&allowed));
    }
    assert_eq!(windows.len(), 0);
}

#[test]
fn a_window_lasts_at_least_a_second_and_at_most_a_minute_whatever_the_retry_after() {
    let mut windows = refusals::Windows::default();
    let mut banned = refusal("ip:banned", 0);
    banned.decision = Decision::Banned;
    banned.retry_after = Some(3600);
    let mut quick = refusal("ip:quick", 0);
    quick.retry_after = None;
    for r in [&banned, &banned, &quick, &quick] {
        windows.admit(r);
    }
    let lines = end_at(&mut windows, 1);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("ip:quick"));
    assert!(end_at(&mut windows, 59).is_empty());
    let lines = end_at(&mut windows, 60);
    assert!(lines[0].contains("decision=banned"), "{lines:?}");
}

#[test]
fn when_every_window_is_taken_a_new_clients_refusals_are_all_written() {
    let mut windows = refusals::Windows::default();
    for i in 0..refusals::WINDOWS {
        assert!(windows.admit(&refusal(&format!("ip:{i}"), 0)));
    }
    assert!(windows.admit(&refusal("ip:late", 0)));
    assert!(windows.admit(&refusal("ip:late", 1)));
    // Those with a window still fold.
    assert!(!windows.admit(&refusal("ip:0", 1)));
    // The bound the operator reads is this one.
    let bound = format!(
        "At most {},{:03} windows are open",
        refusals::WINDOWS / 1000,
        refusals::WINDOWS % 1000
    );
    let docs = include_str!("../../docs/OBSERVABILITY.md").replace('\n', " ");
    assert!(
        docs.contains(&bound),
        "docs/OBSERVABILITY.md says {bound:?}"
    );
}

#[test]
fn the_writer_folds_a_flood_and_summarizes_it_at_flush_as_one_json_object() {
    let out = Capture::default();
    let log = AccessLog::new(Box::new(out.clone()), QUEUE, clock());
    for s in 0..30 {
        let mut r = refusal("key:3f2a9c01…", s);
        r.format = LogFormat::Json;
        log.send(r);
    }
    assert!(log.flush(std::time::Duration::from_secs(5)));
    let text = String::from_utf8(out.0.lock().clone()).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert_eq!(lines[0]["log"], "access");
    assert_eq!(lines[1]["log"], "refusals");
    assert_eq!(lines[1]["client"], "key:3f2a9c01…");
    assert_eq!(lines[1]["refusals"], 30);
    assert_eq!(lines[1]["limiter"], "strict");
    assert_eq!(lines[1]["last"], "2026-01-01T00:00:29.123Z");
    assert_eq!(log.refusals_folded(), 29);
    assert_eq!(log.refusal_windows(), 0);
}
