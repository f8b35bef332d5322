//! The replay report's PNG charts, drawn as bars (the report's tables name what each bar is).

use super::report::Report;

const W: usize = 960;
const H: usize = 360;
const WHITE: [u8; 3] = [255, 255, 255];
const GREY: [u8; 3] = [120, 120, 120];
const BLUE: [u8; 3] = [52, 101, 164];
const ORANGE: [u8; 3] = [237, 127, 16];
const GREEN: [u8; 3] = [78, 154, 6];
const RED: [u8; 3] = [204, 0, 0];

use super::report::LATENCY_BARS;

struct Canvas {
    px: Vec<u8>,
}

impl Canvas {
    fn new() -> Canvas {
        let mut c = Canvas { px: WHITE.repeat(W * H) };
        // The base line.
        c.rect(20, H - 21, W - 40, 1, GREY);
        c
    }

    fn rect(&mut self, x: usize, y: usize, w: usize, h: usize, color: [u8; 3]) {
        for row in y.min(H)..(y + h).min(H) {
            for col in x.min(W)..(x + w).min(W) {
                let at = 3 * (row * W + col);
                self.px[at..at + 3].copy_from_slice(&color);
            }
        }
    }

    /// A bar `value` of `max` high, standing on the base line.
    fn bar(&mut self, x: usize, w: usize, value: f64, max: f64, color: [u8; 3]) {
        let room = (H - 40) as f64;
        let h = if max > 0.0 { ((value / max) * room).round() as usize } else { 0 };
        self.rect(x, H - 21 - h, w, h, color);
    }

    fn png(&self) -> Result<Vec<u8>, super::ReplayError> {
        let mut out = Vec::new();
        let mut enc = png::Encoder::new(&mut out, W as u32, H as u32);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let io = |e: png::EncodingError| super::ReplayError::Io { what: "drawing a chart".into(), source: std::io::Error::other(e) };
        let mut w = enc.write_header().map_err(io)?;
        w.write_image_data(&self.px).map_err(io)?;
        w.finish().map_err(io)?;
        Ok(out)
    }
}

/// p99 latency by digest, captured (blue) beside replayed (orange), for the first digests of
/// the latency table (regressions first).
pub fn latency(r: &Report) -> Result<Vec<u8>, super::ReplayError> {
    let rows = &r.latency[..r.latency.len().min(LATENCY_BARS)];
    let max = rows.iter().map(|l| l.captured_p99_us.max(l.replayed_p99_us)).max().unwrap_or(0) as f64;
    let mut c = Canvas::new();
    let slot = (W - 40) / LATENCY_BARS;
    for (i, l) in rows.iter().enumerate() {
        let x = 20 + i * slot + slot / 8;
        let w = slot * 3 / 8;
        c.bar(x, w, l.captured_p99_us as f64, max, BLUE);
        c.bar(x + w, w, l.replayed_p99_us as f64, max, ORANGE);
    }
    c.png()
}

/// The commands: same result (green), different (red), different where the order of concurrent
/// commands decides (orange), not replayed (grey), on a log scale
/// (a few differences beside many thousands of equal results stay visible).
pub fn totals(r: &Report) -> Result<Vec<u8>, super::ReplayError> {
    let skipped: usize = r.skipped.values().sum();
    let log = |n: usize| ((n + 1) as f64).log10();
    let bars = [(log(r.same), GREEN), (log(r.differing), RED), (log(r.order_dependent), ORANGE), (log(skipped), GREY)];
    let max = bars.iter().map(|b| b.0).fold(0.0, f64::max);
    let mut c = Canvas::new();
    let slot = (W - 40) / bars.len();
    for (i, (n, color)) in bars.iter().enumerate() {
        c.bar(20 + i * slot + slot / 4, slot / 2, *n, max, *color);
    }
    c.png()
}
