//! The tokio loop: one current-thread runtime with its I/O and timer drivers on, as each of
//! sluice's workers runs, and one task per connection that copies both directions
//! (`copy_bidirectional`). What the runtime costs a relay that does no work of its own.

use std::net::TcpListener;

use tokio::net::TcpStream;

use super::Target;

pub fn run(listener: TcpListener, target: &Target) -> std::io::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async {
        listener.set_nonblocking(true)?;
        let listener = tokio::net::TcpListener::from_std(listener)?;
        super::announce_addr(listener.local_addr()?);
        loop {
            let (client, _) = listener.accept().await?;
            let (backend, size) = (target.backend.clone(), target.buf_size);
            tokio::spawn(async move {
                // A connection that fails only ends itself.
                let _ = relay(client, &backend, size).await;
            });
        }
    })
}

async fn relay(mut client: TcpStream, backend: &str, size: usize) -> std::io::Result<()> {
    let mut server = TcpStream::connect(backend).await?;
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    tokio::io::copy_bidirectional_with_sizes(&mut client, &mut server, size, size).await.map(drop)
}
