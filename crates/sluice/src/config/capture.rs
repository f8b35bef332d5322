//! `[capture]`: where captures are written.

use std::path::PathBuf;

use serde::Deserialize;

#[derive(Debug, Clone, Deserialize, serde::Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct CaptureConfig {
    /// The folder every capture goes under, as a folder of its own named by the capture's
    /// start. Made 0700 when missing; it must be sluice's user's and not writable by others,
    /// and no symbolic link may lead to it. Relative to the working folder.
    pub dir: PathBuf,
    /// A capture's start may name an absolute path instead of a name under `dir` (its last
    /// folder is still made by sluice, 0700, and no link is followed to it).
    pub allow_absolute_paths: bool,
}

impl Default for CaptureConfig {
    fn default() -> Self {
        CaptureConfig { dir: PathBuf::from("captures"), allow_absolute_paths: false }
    }
}
