//! A real third-party limiter in front of the provider: nginx with `limit_conn` (keyed by the
//! server's name, so every request counts: an empty key would count none) and
//! `limit_conn_status 429` (a plain 429, no `Retry-After`, as nginx sends it), started on a
//! free loopback port with a configuration written to a temporary folder, and stopped (by its
//! pid) on drop.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running nginx, proxying to one backend with at most `connections` requests at once.
pub(crate) struct Nginx {
    child: Child,
    dir: PathBuf,
    pub(crate) addr: SocketAddr,
}

impl Nginx {
    /// Whether an `nginx` binary is on the PATH (or in /usr/sbin).
    pub(crate) fn available() -> bool {
        Self::binary().is_some()
    }

    fn binary() -> Option<PathBuf> {
        let path = std::env::var_os("PATH").unwrap_or_default();
        std::env::split_paths(&path)
            .chain([PathBuf::from("/usr/sbin")])
            .map(|dir| dir.join("nginx"))
            .find(|candidate| candidate.is_file())
    }

    /// Starts nginx in front of `backend`, refusing with 429 beyond `connections` at once.
    pub(crate) fn start(backend: SocketAddr, connections: u32) -> Result<Self, String> {
        let binary = Self::binary().ok_or("nginx is not installed (apt-get install nginx-light)")?;
        let port = wavegate_testkit::free_port().map_err(|e| format!("a free port: {e}"))?;
        let dir = std::env::temp_dir().join(format!("wavegate-scenarios-nginx-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let d = dir.display();
        let config = format!(
            "worker_processes 1;\ndaemon off;\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\n\
             events {{ worker_connections 4096; }}\n\
             http {{\n  access_log off;\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n\
             \x20 fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n\
             \x20 limit_conn_zone $server_name zone=calls:1m;\n\
             \x20 server {{\n    listen 127.0.0.1:{port};\n    server_name scenario;\n    location / {{\n      limit_conn calls {connections};\n\
             \x20     limit_conn_status 429;\n      proxy_pass http://{backend};\n    }}\n  }}\n}}\n"
        );
        let path = dir.join("nginx.conf");
        std::fs::write(&path, config).map_err(|e| format!("{}: {e}", path.display()))?;
        let child = Command::new(binary)
            .arg("-p")
            .arg(&dir)
            .arg("-c")
            .arg(&path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot start nginx: {e}"))?;
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let nginx = Self { child, dir, addr };
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_err() {
            if Instant::now() > deadline {
                return Err(format!("nginx did not listen on {addr} within 10 s"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(nginx)
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
