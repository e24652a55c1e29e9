//! `tpuc plugins`: what each PJRT plugin on this machine is and offers.
use anyhow::Result;
use std::path::PathBuf;
use tpuc_pjrt::{discover, Client, ClientOptions, Plugin};

/// Lists the plugins found (looking in `search_paths` first), or describes `only`.
pub fn list(only: Option<&str>, search_paths: &[PathBuf]) -> Result<()> {
    let found: Vec<(String, PathBuf)> = match only {
        Some(spec) => vec![(
            spec.to_string(),
            discover::resolve_in(Some(spec), search_paths)?,
        )],
        None => discover::installed_in(search_paths)
            .into_iter()
            .map(|(name, path)| (name.to_string(), path))
            .collect(),
    };
    if found.is_empty() {
        let names: Vec<String> = discover::KNOWN_PLUGINS
            .iter()
            .map(|k| format!("{} ({})", k.name, k.package))
            .collect();
        say!("no PJRT plugins found; tpuc knows {}", names.join(", "))?;
        return Ok(());
    }
    for (name, path) in found {
        say!("{name}: {}", path.display())?;
        if let Err(e) = describe(&path) {
            say!("  unusable: {e:#}")?;
        }
    }
    Ok(())
}

fn describe(path: &std::path::Path) -> Result<()> {
    let plugin = Plugin::load(path)?;
    let (major, minor) = plugin.api_version();
    say!("  PJRT API:  {major}.{minor}")?;
    for key in [
        "stablehlo_current_version",
        "stablehlo_minimum_version",
        "xla_version",
    ] {
        if let Some(value) = plugin.attribute(key) {
            say!("  {key}: {value}")?;
        }
    }
    let client = Client::new(&plugin, &ClientOptions::default())?;
    say!(
        "  platform:  {} {}",
        client.platform_name()?,
        client.platform_version()?
    )?;
    let devices = client.addressable_devices()?;
    say!("  devices:   {}", devices.len())?;
    for device in &devices {
        let memories: Vec<String> = device
            .memories()?
            .iter()
            .map(|m| m.kind())
            .collect::<Result<_, _>>()?;
        say!(
            "    {} (id {}, kind {}, memories: {})",
            device.debug_string()?,
            device.id()?,
            device.kind()?,
            memories.join(", ")
        )?;
    }
    Ok(())
}
