//! The arguments every cluster command shares: where the metadata service is, and how a
//! report is printed. Kept apart from the commands so that each command file imports only
//! downwards.

use crate::show::Output;
use anyhow::Context;
use clap::Args;
use flotilla_client::Client;

#[derive(Args)]
pub struct MetaArg {
    /// Address of the metadata service, or every address of its group as `a,b,c` (the
    /// node that serves is found and followed).
    #[arg(long, env = "FLOTILLA_META", default_value = flotilla_meta::config::DEFAULT_META_ADDR)]
    pub meta: String,
}

impl MetaArg {
    pub(crate) fn client(&self) -> anyhow::Result<Client> {
        crate::keys::client(&self.meta).context("connect to the metadata service")
    }
}

/// A report on the cluster, in human units, bytes or JSON.
#[derive(Args)]
pub struct ReportArgs {
    #[command(flatten)]
    pub(crate) meta: MetaArg,
    #[command(flatten)]
    pub(crate) output: Output,
}

impl ReportArgs {
    /// A client of the cluster and the output style.
    pub fn parts(self) -> anyhow::Result<(Client, Output)> {
        Ok((self.meta.client()?, self.output))
    }
}
