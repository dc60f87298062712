//! A `redis-server` that speaks TLS, with certificates made for the test.
//!
//! [`TestCertificates::generate`] runs `openssl` to make a throwaway CA and a server
//! certificate for `127.0.0.1` and `localhost` signed by it, in a temporary directory;
//! [`TlsRedisServer::start`] starts a [`RedisServer`] that also listens with TLS on a second
//! free port (`--tls-port`, no client certificates required). Clients trust the CA with
//! [`TlsRedisServer::root_certificate`] and connect to [`TlsRedisServer::url`]
//! (`rediss://127.0.0.1:PORT/`); the plain port stays open for the harness and the test's
//! own checks.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use tempfile::TempDir;

use crate::{HarnessError, RedisServer, free_port};

/// A CA and a server certificate for 127.0.0.1, valid for a day; removed on drop.
#[derive(Debug)]
pub struct TestCertificates {
    dir: TempDir,
}

impl TestCertificates {
    /// Makes them with `openssl` (P-256 keys).
    ///
    /// # Errors
    ///
    /// [`HarnessError::Spawn`] if `openssl` cannot be run, [`HarnessError::Io`] if it fails.
    pub fn generate() -> Result<Self, HarnessError> {
        let dir = tempfile::Builder::new().prefix("wavegate-tls-").tempdir()?;
        let path = dir.path();
        std::fs::write(path.join("server.ext"), "subjectAltName=IP:127.0.0.1,DNS:localhost\n")?;
        let key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
        openssl(
            path,
            &[&["req", "-x509"][..], &key, &["-keyout", "ca.key", "-out", "ca.crt"]].concat(),
            "/CN=wavegate test CA",
        )?;
        openssl(
            path,
            &[&["req"][..], &key, &["-keyout", "server.key", "-out", "server.csr"]].concat(),
            "/CN=localhost",
        )?;
        let sign = [
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "1",
            "-extfile",
            "server.ext",
        ];
        openssl(path, &sign, "")?;
        Ok(Self { dir })
    }

    /// The CA certificate (PEM): the root a client must trust.
    pub fn ca_path(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    /// The server certificate (PEM).
    pub fn cert_path(&self) -> PathBuf {
        self.dir.path().join("server.crt")
    }

    /// The server's private key (PEM).
    pub fn key_path(&self) -> PathBuf {
        self.dir.path().join("server.key")
    }
}

fn openssl(dir: &Path, args: &[&str], subject: &str) -> Result<(), HarnessError> {
    let mut command = Command::new("openssl");
    command.args(args).current_dir(dir).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
    if !subject.is_empty() {
        command.args(["-subj", subject, "-days", "1"]);
    }
    let output = command.output().map_err(|source| HarnessError::Spawn { binary: "openssl".into(), source })?;
    if output.status.success() {
        Ok(())
    } else {
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        Err(HarnessError::Io(std::io::Error::other(format!("openssl {args:?} failed: {stderr}"))))
    }
}

/// A [`RedisServer`] that also listens with TLS; stopped (and its certificates removed) on drop.
#[derive(Debug)]
pub struct TlsRedisServer {
    server: RedisServer,
    tls_port: u16,
    certificates: TestCertificates,
}

impl TlsRedisServer {
    /// Makes certificates and starts the server with `--tls-port` on a free port.
    ///
    /// # Errors
    ///
    /// As for [`TestCertificates::generate`] and [`RedisServer::start`] (a `redis-server` built
    /// without TLS exits at once, with its complaint in the error's log tail).
    pub fn start() -> Result<Self, HarnessError> {
        let certificates = TestCertificates::generate()?;
        let tls_port = free_port()?;
        let server = RedisServer::builder()
            .extra_arg("--tls-port")
            .extra_arg(tls_port.to_string())
            .extra_arg("--tls-cert-file")
            .extra_arg(certificates.cert_path())
            .extra_arg("--tls-key-file")
            .extra_arg(certificates.key_path())
            .extra_arg("--tls-ca-cert-file")
            .extra_arg(certificates.ca_path())
            .extra_arg("--tls-auth-clients")
            .extra_arg("no")
            .start()?;
        Ok(Self { server, tls_port, certificates })
    }

    /// `rediss://127.0.0.1:{tls port}/`.
    pub fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}/", self.tls_port)
    }

    /// The TLS port.
    pub fn tls_port(&self) -> u16 {
        self.tls_port
    }

    /// The CA certificate (PEM) the server's certificate chains to.
    ///
    /// # Errors
    ///
    /// If the file cannot be read.
    pub fn root_certificate(&self) -> Result<Vec<u8>, HarnessError> {
        Ok(std::fs::read(self.certificates.ca_path())?)
    }

    /// The server (its plain port, kill, pause, restart …).
    pub fn server(&mut self) -> &mut RedisServer {
        &mut self.server
    }
}
