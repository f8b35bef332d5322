//! An instance that does not act on the topology (another holds the failover lease,
//! `crate::control::cluster`) follows what the acting one does: its primary is the one
//! writable server, sessions hold their next command while there is none, another writable
//! server is kept out, and a server kept out serves again once it replicates from the primary.

use std::sync::Arc;

use sluice_proto::gtid::Position;

use super::{fence, fence_writable, steps};
use crate::backend::{Backend, FenceKind};
use crate::config::Config;
use crate::ctx::Ctx;

pub(super) fn tick(ctx: &Ctx, c: &Config) {
    let list: Vec<Arc<Backend>> = ctx.backends.list().iter().cloned().collect();
    super::give_up_replaced(ctx, &list);
    let topo = &ctx.backends.topology;
    let writable = |b: &Backend| b.is_up() && b.replication.lock().read_only == Some(false);
    let known = topo.primary().and_then(|i| list.iter().find(|b| b.index == i)).cloned();
    let primary = match known {
        Some(p) if writable(&p) => p,
        _ => {
            let others: Vec<&Arc<Backend>> = list.iter().filter(|b| writable(b) && !b.is_fenced()).collect();
            let [p] = others[..] else {
                if known.is_some() && c.failover.enabled {
                    topo.hold();
                }
                return;
            };
            if let Some(old) = known {
                let why = format!("the primary until the acting instance promoted {}", p.name);
                old.set_fence(Some(fence(FenceKind::Replaced, why)));
                tracing::warn!(backend = %p.name, "failover: following the primary the acting instance made");
            }
            topo.set_primary(p.index);
            p.clone()
        }
    };
    if topo.is_held() {
        topo.release();
    }
    if let Some(pos) = Position::parse(&primary.replication.lock().gtid_binlog_pos) {
        topo.saw(pos);
    }
    fence_writable(&list, &primary);
    let source = steps::source_name(&primary);
    for b in list.iter().filter(|b| b.is_fenced() && b.is_up()) {
        let follows = b.replication.lock().replica.as_ref().is_some_and(|r| r.running && Some(&r.source) == source.as_ref());
        if follows {
            tracing::info!(backend = %b.name, "failover: it replicates from the primary again: back in service");
            b.set_fence(None);
        }
    }
}
