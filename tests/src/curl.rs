//! etcd's JSON gateway through `curl`, the way its documentation drives it: one-shot POSTs
//! answered with a status and a JSON body, and streams (watch, lease keep-alive, snapshot) read
//! line by line with a deadline. Also the standard base64 the gateway's JSON uses for bytes.

use std::process::Command;

use crate::lines::LineReader;

/// Longest a one-shot request may take (generous: a noisy 2-core CI).
pub const REQUEST_TIMEOUT_SECS: &str = "30";

/// `curl -X POST <endpoint><path> -d <body>`: the HTTP status and the body.
pub fn post(endpoint: &str, path: &str, body: &str) -> (u16, String) {
    request(endpoint, "POST", path, body)
}

/// Any method (the gateway answers only POST).
pub fn request(endpoint: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    request_with(endpoint, method, path, body, &[])
}

/// A GET with HTTP headers (`("x-strata-tenant", name)`: a probe of one tenant).
pub fn get_with(endpoint: &str, path: &str, headers: &[(&str, &str)]) -> (u16, String) {
    request_with(endpoint, "GET", path, "", headers)
}

/// Whether the Prometheus text a component serves at `http://<addr>/metrics` has a line
/// starting with `prefix` (a metric's name, with its labels if they matter).
pub fn has_metric(addr: &str, prefix: &str) -> bool {
    request(&format!("http://{addr}"), "GET", "/metrics", "")
        .1
        .lines()
        .any(|l| l.starts_with(prefix))
}

/// `post` with HTTP headers (`("Authorization", token)`: how a gateway client sends its token).
pub fn post_with(
    endpoint: &str,
    path: &str,
    body: &str,
    headers: &[(&str, &str)],
) -> (u16, String) {
    request_with(endpoint, "POST", path, body, headers)
}

fn request_with(
    endpoint: &str,
    method: &str,
    path: &str,
    body: &str,
    headers: &[(&str, &str)],
) -> (u16, String) {
    let url = format!("{endpoint}{path}");
    let mut cmd = Command::new("curl");
    for (name, value) in headers {
        cmd.args(["-H", &format!("{name}: {value}")]);
    }
    let out = cmd
        .args(["-s", "-X", method, "--max-time", REQUEST_TIMEOUT_SECS])
        .args(["-w", "\n%{http_code}", "-d", body, &url])
        .output()
        .unwrap_or_else(|e| panic!("run curl (is it installed?): {e}"));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text
        .rsplit_once('\n')
        .unwrap_or_else(|| panic!("curl {url}: no status in {text:?}"));
    let code = code
        .parse()
        .unwrap_or_else(|_| panic!("curl {url}: bad status {code:?}"));
    (code, body.to_string())
}

/// A streaming POST (`curl -N`) whose answer is read one line at a time; curl is killed when
/// the reader is dropped.
pub fn post_lines(endpoint: &str, path: &str, body: &str) -> LineReader {
    let mut cmd = Command::new("curl");
    cmd.args([
        "-sN",
        "-X",
        "POST",
        "-d",
        body,
        &format!("{endpoint}{path}"),
    ]);
    LineReader::spawn(cmd)
}

/// Standard base64 with padding (what etcd's JSON and etcdctl's `-w json` use for bytes).
pub fn b64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk.len();
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let v = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= n {
                out.push(ALPHABET[((v >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}
