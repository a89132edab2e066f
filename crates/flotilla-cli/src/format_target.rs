//! `flotilla format-target`: creates a `lines` target (its id file and its image with the
//! geometry given: a preallocated file, or with `--device` a block device that DIR's image
//! name links to), or, with `--recover`, opens an existing one and reports what recovery from
//! its descriptors cost. Also `flotilla target accept-loss`, which repairs a target that
//! lost its contents by accepting the loss.

use anyhow::Context;
use flotilla_store::{
    LinesDisk, Target, TargetKind, TargetSpec, CHECKSUM_BLOCK_BYTES_DEFAULT, LINES_IMAGE_NAME,
};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct FormatTargetArgs {
    /// The target: lines:DIR (or lines+sim:MODEL:DIR); DIR is created if missing.
    pub spec: String,
    /// Bytes of the image (whole lines; k/m/g suffixes). Default: 256m for an image file, the
    /// whole device with `--device`.
    #[arg(long, value_parser = parse_bytes)]
    pub capacity: Option<u64>,
    /// Put the image on this block device (DIR/lines.img becomes a symbolic link to it). A
    /// device already holding a lines image is refused.
    #[arg(long)]
    pub device: Option<PathBuf>,
    /// Bytes of one block slot (a power of two).
    #[arg(long, default_value = "64k", value_parser = parse_bytes)]
    pub block_size: u64,
    /// Block slots per line (one descriptor entry each).
    #[arg(long, default_value_t = 512)]
    pub line_blocks: u32,
    /// RAMA's sequentiality: consecutive blocks of a fork hashed to one line.
    #[arg(long, default_value_t = 64)]
    pub group_blocks: u32,
    /// Do not format: open the existing image, rebuild its state from the descriptors and
    /// report the time taken and the descriptor bytes read.
    #[arg(long)]
    pub recover: bool,
}

#[derive(clap::Subcommand)]
pub enum TargetCommand {
    /// Repairs a target that lost its contents (`flotilla status` shows it `lost`) by
    /// accepting the loss: empties it and marks it whole again, so its server serves it;
    /// what it held then reads as zeros. Run it with the target's server stopped.
    AcceptLoss {
        /// The target: DIR, dir:DIR or sim:MODEL:DIR (as in the server's configuration).
        spec: String,
    },
    /// Moves every replicated chain off TARGET online: each chain gets a replacement member
    /// in another failure group, copied whole at `resync_bytes_per_s`; TARGET leaves a chain
    /// once its replacement serves. `flotilla status` shows the target `draining` and the
    /// bytes left to rebuild. Admin credentials only.
    Drain {
        /// The target id, in hex as `flotilla status` shows it.
        target: String,
        #[command(flatten)]
        meta: crate::args::MetaArg,
    },
    /// Declares TARGET dead now (as if silent past `dead_after_ms`): it leaves every chain at
    /// once and each gets a replacement copied from the remaining members. Refused where
    /// TARGET holds a chain's last serving copy. Admin credentials only.
    Remove {
        /// The target id, in hex as `flotilla status` shows it.
        target: String,
        #[command(flatten)]
        meta: crate::args::MetaArg,
    },
}

/// A target id as `flotilla status` prints it (hex, with or without `0x`).
fn parse_target(text: &str) -> anyhow::Result<flotilla_types::TargetId> {
    let digits = text.strip_prefix("0x").unwrap_or(text);
    u64::from_str_radix(digits, 16)
        .ok()
        .filter(|&id| id != 0)
        .map(flotilla_types::TargetId)
        .ok_or_else(|| anyhow::anyhow!("{text:?} is not a target id (hex, as `flotilla status` shows it)"))
}

pub fn target(command: TargetCommand) -> anyhow::Result<()> {
    use flotilla_proto::TargetAction;
    match command {
        TargetCommand::Drain { target, meta } => {
            let id = parse_target(&target)?;
            crate::chains::target_admin(&meta.meta, id, TargetAction::Drain)?;
            println!("target {id}: draining; its chains are copied elsewhere (see `flotilla status`)");
            Ok(())
        }
        TargetCommand::Remove { target, meta } => {
            let id = parse_target(&target)?;
            crate::chains::target_admin(&meta.meta, id, TargetAction::Remove)?;
            println!("target {id}: removed; its chains are rebuilt elsewhere (see `flotilla status`)");
            Ok(())
        }
        TargetCommand::AcceptLoss { spec } => {
            let spec = TargetSpec::parse(std::path::Path::new(&spec))?;
            let id = Target::accept_loss(&spec)?;
            println!("target {id} at {}: loss accepted; it is empty and will be served", spec.dir.display());
            Ok(())
        }
    }
}

fn parse_bytes(text: &str) -> Result<u64, String> {
    flotilla_types::parse_size(text).ok_or_else(|| format!("bad size {text:?}"))
}

pub fn run(args: FormatTargetArgs) -> anyhow::Result<()> {
    let spec = TargetSpec::parse(std::path::Path::new(&args.spec))?;
    let TargetKind::Lines(mut options) = spec.kind else {
        anyhow::bail!("format-target formats lines targets (lines:DIR), not {:?}", args.spec);
    };
    let image = spec.dir.join(LINES_IMAGE_NAME);
    if args.recover {
        return report_recovery(image);
    }
    if image.exists() {
        anyhow::bail!("{} already holds a lines image; remove the directory to reformat", spec.dir.display());
    }
    std::fs::create_dir_all(&spec.dir).with_context(|| format!("create {}", spec.dir.display()))?;
    options.capacity_bytes = match &args.device {
        Some(device) => link_device(device, &image, args.capacity)?,
        None => args.capacity.unwrap_or(256 << 20),
    };
    options.block_bytes = args.block_size;
    options.line_blocks = args.line_blocks;
    options.group_blocks = args.group_blocks;
    options.reorganize_interval_ms = 0;
    let geometry = options.geometry().map_err(|reason| anyhow::anyhow!("{}: {reason}", args.spec))?;
    let spec = TargetSpec { kind: TargetKind::Lines(options), dir: spec.dir };
    // A device is formatted here, explicitly (a server never formats a device it finds
    // without a superblock); a file image is made by the target's own initialization.
    if args.device.is_some() {
        if let Err(error) = flotilla_store::format_lines_image(&image, &geometry) {
            let _ = std::fs::remove_file(&image);
            return Err(anyhow::anyhow!("format {}: {error}", image.display()));
        }
    }
    let target = Target::open_spec(&spec, true, CHECKSUM_BLOCK_BYTES_DEFAULT)?;
    println!(
        "formatted target {} at {}: {} lines of {} blocks of {} bytes ({} bytes of data, {} of descriptors), groups of {} blocks",
        target.id(),
        image.display(),
        geometry.line_count,
        geometry.line_blocks,
        geometry.block_bytes,
        geometry.slots() * u64::from(geometry.block_bytes),
        geometry.descriptor_area_bytes(),
        geometry.group_blocks,
    );
    Ok(())
}

/// Links the image name to `device` (a block device) and returns the capacity to format:
/// `capacity` if given, else the device's size.
fn link_device(
    device: &std::path::Path,
    image: &std::path::Path,
    capacity: Option<u64>,
) -> anyhow::Result<u64> {
    if !flotilla_store::is_block_device(device) {
        anyhow::bail!("--device {}: not a block device", device.display());
    }
    let mut opened = std::fs::File::open(device).with_context(|| format!("open {}", device.display()))?;
    let size_bytes = std::io::Seek::seek(&mut opened, std::io::SeekFrom::End(0))?;
    if capacity.is_some_and(|c| c > size_bytes) {
        anyhow::bail!("--capacity is larger than {} ({size_bytes} bytes)", device.display());
    }
    std::os::unix::fs::symlink(device, image)
        .with_context(|| format!("link {} to {}", image.display(), device.display()))?;
    Ok(capacity.unwrap_or(size_bytes))
}

fn report_recovery(image: PathBuf) -> anyhow::Result<()> {
    let disk = LinesDisk::open_image(&image).with_context(|| format!("open {}", image.display()))?;
    let recovery = disk.recovery();
    println!(
        "recovered {} from {} descriptor bytes in {:.3} ms ({} torn copies, {} blocks named twice, {} bytes free)",
        image.display(),
        recovery.descriptor_area_bytes,
        recovery.elapsed.as_secs_f64() * 1e3,
        recovery.torn_copies,
        recovery.duplicates,
        disk.free_bytes(),
    );
    Ok(())
}
