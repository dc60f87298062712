//! What the web tests share: an actix-web server on a free loopback port.
#![allow(dead_code)] // each test file uses only some of it

use std::net::SocketAddr;

use actix_web::{App, HttpServer, web};

/// Serves an app made by `setup` (its data, its routes, `wavegate_web::configure`) with
/// `workers` workers on a free port of 127.0.0.1, on the current actix system; its address.
pub(crate) fn serve_with(
    workers: usize,
    setup: impl Fn(&mut web::ServiceConfig) + Clone + Send + 'static,
) -> SocketAddr {
    let server = HttpServer::new(move || App::new().configure(setup.clone()))
        .workers(workers)
        .disable_signals()
        .bind(("127.0.0.1", 0))
        .expect("bind");
    let addr = server.addrs()[0];
    actix_web::rt::spawn(server.run());
    addr
}

/// [`serve_with`] one worker.
pub(crate) fn serve(setup: impl Fn(&mut web::ServiceConfig) + Clone + Send + 'static) -> SocketAddr {
    serve_with(1, setup)
}
