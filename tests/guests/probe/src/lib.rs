//! Attacks the WASI surface: looks for environment variables, arguments, files (the host's
//! root, /etc/passwd, the current directory) and the network (TCP to a loopback port given
//! in the input, and a DNS lookup). Reports what it got; the host must grant none of it.

use std::io::Read;
use wasq_guest::serde::Deserialize;
use wasq_guest::serde_json::{Value, json};
use wasq_guest::{Error, info};

#[derive(Deserialize)]
#[serde(crate = "wasq_guest::serde")]
struct Input {
    /// A loopback port with a listener on it, opened by the test.
    port: u16,
}

fn outcome<T>(r: std::io::Result<T>) -> Value {
    match r {
        Ok(_) => json!("granted"),
        Err(e) => json!(format!("denied: {e}")),
    }
}

fn probe(input: Input) -> Result<Value, Error> {
    let env: Vec<String> = std::env::vars().map(|(k, v)| format!("{k}={v}")).collect();
    let args: Vec<String> = std::env::args().collect();
    let read_passwd = outcome(std::fs::File::open("/etc/passwd").and_then(|mut f| {
        let mut s = String::new();
        f.read_to_string(&mut s)
    }));
    let list_root = outcome(std::fs::read_dir("/").map(|d| d.count()));
    let list_cwd = outcome(std::fs::read_dir(".").map(|d| d.count()));
    let write_tmp = outcome(std::fs::write("/tmp/wasq-probe", b"x"));
    let tcp = outcome(std::net::TcpStream::connect(("127.0.0.1", input.port)));
    let dns = outcome(std::net::ToSocketAddrs::to_socket_addrs(&("localhost", 80)));
    info!("probe finished");
    Ok(json!({
        "env": env,
        "args": args,
        "read_passwd": read_passwd,
        "list_root": list_root,
        "list_cwd": list_cwd,
        "write_tmp": write_tmp,
        "tcp": tcp,
        "dns": dns,
    }))
}

wasq_guest::task!(probe);
