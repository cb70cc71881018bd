//! A [`Chart`] drawn with plotters on its SVG backend. Text is written as `<text>` elements
//! for the viewer to set (plotters' `ttf` and `ab_glyph` features are off: no font is read),
//! and its width is estimated where the layout needs it.

use std::ops::Range;

use plotters::{
    coord::{
        ranged1d::{DefaultFormatting, KeyPointHint},
        Shift,
    },
    element::DashedPathElement,
    prelude::*,
    style::text_anchor::{HPos, Pos, VPos},
};
use tower_allowance::BoxError;

use super::{
    fmt_tick, time_ticks, wrap, Chart, Colour, Panel, Series, Shape, Span, Swatch, XAxis, YAxis,
};

/// The narrowest chart, px.
const WIDTH: i32 = 860;
/// The y axis's labels and title, left of every plot.
const LEFT: i32 = 80;
const RIGHT: i32 = 30;
const PAD: i32 = 10;
const TITLE_H: i32 = 26;
const LEGEND_ROW_H: i32 = 22;
const PANEL_TITLE_H: i32 = 20;
const SUBTITLE_H: i32 = 16;
/// Above each plot, for the top tick label.
const PLOT_MARGIN: i32 = 6;
const VALUES_H: i32 = 150;
const LANE_H: i32 = 18;
/// Tick labels and the title under a time axis.
const TIME_AXIS_H: i32 = 36;
const CATEGORY_AXIS_H: i32 = 6;
const PANEL_GAP: i32 = 12;
/// The least width of one group of bars.
const CATEGORY_W: i32 = 64;
const LINE_H: i32 = 14;
/// An event tick's height.
const TICK_H: f64 = 10.0;

const AXIS: RGBColor = RGBColor(0x33, 0x33, 0x33);
const GRID: RGBColor = RGBColor(0xe0, 0xe0, 0xe0);
const LABEL: RGBColor = RGBColor(0x44, 0x44, 0x44);
const STRIPE: RGBColor = RGBColor(0xf4, 0xf6, 0xf8);

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

/// An axis from 0 to `end` with its ticks (and grid lines) exactly at `ticks`.
struct Axis {
    end: f64,
    ticks: Vec<f64>,
}

impl Ranged for Axis {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, (from, to): (i32, i32)) -> i32 {
        let share = (value / self.end).clamp(0.0, 1.0);
        from + (f64::from(to - from) * share).round() as i32
    }

    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            Vec::new()
        } else {
            self.ticks.clone()
        }
    }

    fn range(&self) -> Range<f64> {
        0.0..self.end
    }
}

pub(super) fn render(chart: &Chart) -> Result<String, BoxError> {
    let width = match &chart.x {
        XAxis::Categories { labels, .. } => {
            (LEFT + CATEGORY_W * count(labels.len()) + RIGHT).max(WIDTH)
        }
        XAxis::Time { .. } => WIDTH,
    };
    let legend = legend_rows(chart, width);
    // About 6.5 px per character at 11 px.
    let wrap_at = usize::try_from((width - 2 * PAD) * 2 / 13).unwrap_or(80);
    let caption: Vec<Vec<String>> = chart.caption.iter().map(|p| wrap(p, wrap_at)).collect();
    let caption_h = caption.iter().map(|p| count(p.len()) * LINE_H + 5);
    let panels_h = chart.panels.iter().map(|p| panel_height(&chart.x, p));
    let height = [
        PAD,
        chart.title.as_ref().map_or(0, |_| TITLE_H),
        count(legend.len()) * LEGEND_ROW_H,
        categories_height(&chart.x),
        PAD,
    ]
    .into_iter()
    .chain(caption_h)
    .chain(panels_h)
    .fold(0, i32::saturating_add);

    let mut out = String::new();
    {
        let size = (
            u32::try_from(width).unwrap_or(0),
            u32::try_from(height).unwrap_or(0),
        );
        let root = SVGBackend::with_string(&mut out, size).into_drawing_area();
        root.fill(&WHITE)?;
        let mut y = PAD;
        if let Some(title) = &chart.title {
            write(&root, title, (LEFT, y + 8), font(14.0, AXIS).bold())?;
            y += TITLE_H;
        }
        for row in &legend {
            for (x, swatch, label) in row {
                draw_swatch(&root, *swatch, (*x, y + 8))?;
                write(&root, label, (x + 28, y + 8), font(12.0, BLACK))?;
            }
            y += LEGEND_ROW_H;
        }
        for panel in &chart.panels {
            draw_panel(&root, &chart.x, panel, y, width)?;
            y += panel_height(&chart.x, panel);
        }
        if let XAxis::Categories { labels, title } = &chart.x {
            let plot_w = f64::from(width - LEFT - RIGHT);
            for (i, label) in labels.iter().enumerate() {
                let x = LEFT + ((i as f64 + 0.5) * plot_w / labels.len() as f64) as i32;
                for (k, line) in label.lines().enumerate() {
                    let at = (x, y + LINE_H / 2 + count(k) * LINE_H);
                    write(&root, line, at, font(11.0, LABEL).centred())?;
                }
            }
            y += label_lines(labels) * LINE_H + 14;
            let x = LEFT + (plot_w / 2.0) as i32;
            write(&root, title, (x, y), font(11.0, LABEL).centred())?;
            y += 18;
        }
        for paragraph in &caption {
            y += 5;
            for line in paragraph {
                write(&root, line, (PAD, y + LINE_H / 2), font(11.0, AXIS))?;
                y += LINE_H;
            }
        }
        root.present()?;
    }
    Ok(out)
}

/// The legend laid out in rows that fit `width`: each entry's x, swatch and label.
fn legend_rows(chart: &Chart, width: i32) -> Vec<Vec<(i32, Swatch, String)>> {
    let mut rows: Vec<Vec<(i32, Swatch, String)>> = Vec::new();
    let mut x = LEFT;
    for (swatch, label) in chart.legend() {
        let w = 28 + text_width(label, 12.0) + 16;
        if x + w > width - RIGHT && x > LEFT {
            x = LEFT;
        }
        if x == LEFT {
            rows.push(Vec::new());
        }
        if let Some(row) = rows.last_mut() {
            row.push((x, swatch, label.to_owned()));
        }
        x += w;
    }
    rows
}

/// A count as pixels' factor, capped (a chart that large is not drawn sensibly anyway).
fn count(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX).min(1 << 20)
}

fn text_width(text: &str, px: f64) -> i32 {
    (text.chars().count() as f64 * px * 0.5) as i32
}

fn label_lines(labels: &[String]) -> i32 {
    count(labels.iter().map(|l| l.lines().count()).max().unwrap_or(0))
}

fn categories_height(x: &XAxis) -> i32 {
    match x {
        XAxis::Categories { labels, .. } => label_lines(labels) * LINE_H + 14 + 18,
        XAxis::Time { .. } => 0,
    }
}

fn plot_height(panel: &Panel) -> i32 {
    match &panel.y {
        YAxis::Lanes(lanes) => LANE_H.saturating_mul(count(lanes.len().max(1))),
        YAxis::Values { .. } => VALUES_H,
    }
}

fn axis_height(x: &XAxis) -> i32 {
    match x {
        XAxis::Time { .. } => TIME_AXIS_H,
        XAxis::Categories { .. } => CATEGORY_AXIS_H,
    }
}

fn panel_height(x: &XAxis, panel: &Panel) -> i32 {
    PANEL_TITLE_H
        + panel.subtitle.as_ref().map_or(0, |_| SUBTITLE_H)
        + PLOT_MARGIN
        + plot_height(panel)
        + axis_height(x)
        + PANEL_GAP
}

fn rgb(c: Colour) -> RGBColor {
    let (r, g, b) = c.rgb();
    RGBColor(r, g, b)
}

/// A text style at `px` pixels (plotters' SVG backend writes sizes divided by 1.24).
fn font(px: f64, colour: RGBColor) -> TextStyle<'static> {
    TextStyle {
        font: ("sans-serif", px * 1.24).into_font(),
        color: colour.to_backend_color(),
        pos: Pos::new(HPos::Left, VPos::Center),
    }
}

trait TextStyleExt {
    fn bold(self) -> Self;
    fn centred(self) -> Self;
    fn right(self) -> Self;
}

impl TextStyleExt for TextStyle<'static> {
    fn bold(mut self) -> Self {
        self.font = self.font.style(FontStyle::Bold);
        self
    }
    fn centred(self) -> Self {
        self.pos(Pos::new(HPos::Center, VPos::Center))
    }
    fn right(self) -> Self {
        self.pos(Pos::new(HPos::Right, VPos::Center))
    }
}

/// `text` with its left edge (or its anchor) at `at`, vertically centred on it.
fn write(
    root: &Area<'_>,
    text: &str,
    at: (i32, i32),
    style: TextStyle<'static>,
) -> Result<(), BoxError> {
    root.draw(&Text::new(text.to_owned(), at, style))?;
    Ok(())
}

fn draw_swatch(root: &Area<'_>, swatch: Swatch, (x, y): (i32, i32)) -> Result<(), BoxError> {
    match swatch {
        Swatch::Line(c, w) => {
            let style = rgb(c).stroke_width(w.max(1));
            root.draw(&PathElement::new(vec![(x, y), (x + 22, y)], style))?;
        }
        Swatch::Dot(c) => root.draw(&Circle::new((x + 11, y), 5, rgb(c).filled()))?,
        Swatch::Cross(c) => root.draw(&Cross::new((x + 11, y), 5, rgb(c).stroke_width(2)))?,
        Swatch::Block(c, opacity) => {
            let style = rgb(c).mix(opacity.max(0.3)).filled();
            root.draw(&Rectangle::new([(x + 2, y - 6), (x + 20, y + 6)], style))?;
        }
        Swatch::Hatched(c) => hatched(root, rgb(c), (x + 4, y - 6), (x + 18, y + 6))?,
        Swatch::Tick(c) => {
            let style = rgb(c).stroke_width(2);
            root.draw(&PathElement::new(
                vec![(x + 11, y - 6), (x + 11, y + 6)],
                style,
            ))?;
        }
    }
    Ok(())
}

/// A pale rectangle with diagonal stripes, in pixels.
fn hatched(
    root: &Area<'_>,
    c: RGBColor,
    (x0, y0): (i32, i32),
    (x1, y1): (i32, i32),
) -> Result<(), BoxError> {
    root.draw(&Rectangle::new([(x0, y0), (x1, y1)], c.mix(0.3).filled()))?;
    let (w, h) = (x1 - x0, y1 - y0);
    // Lines rising at 45° from the bottom edge, every 5 px, cut to the rectangle.
    for k in (-h..w).step_by(5) {
        let (lo, hi) = (0.max(-k), h.min(w - k));
        if lo < hi {
            let line = vec![(x0 + k + lo, y1 - lo), (x0 + k + hi, y1 - hi)];
            root.draw(&PathElement::new(line, c.stroke_width(2)))?;
        }
    }
    Ok(())
}

/// A panel's plot: its axes, and data to chart coordinates, kept inside the axes.
struct Frame<'p> {
    x: &'p XAxis,
    lanes: Option<&'p [String]>,
    x_end: f64,
    y_top: f64,
    y_step: f64,
    /// One pixel, in data units.
    px: (f64, f64),
}

type Plot<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<Axis, Axis>>;

impl<'p> Frame<'p> {
    fn of(x: &'p XAxis, panel: &'p Panel, width: i32) -> Self {
        let x_end = match x {
            XAxis::Time { end_ms, .. } => (*end_ms).max(1) as f64,
            XAxis::Categories { labels, .. } => labels.len().max(1) as f64,
        };
        let lanes = match &panel.y {
            YAxis::Lanes(lanes) => Some(lanes.as_slice()),
            YAxis::Values { .. } => None,
        };
        let (y_top, y_step) = panel.y_ticks();
        let px = (
            x_end / f64::from(width - LEFT - RIGHT),
            y_top / f64::from(plot_height(panel)),
        );
        Self {
            x,
            lanes,
            x_end,
            y_top,
            y_step,
            px,
        }
    }

    /// Time as it is; a category at the middle of its group.
    fn x(&self, v: f64) -> f64 {
        match self.x {
            XAxis::Time { .. } => v.clamp(0.0, self.x_end),
            XAxis::Categories { .. } => (v + 0.5).clamp(0.0, self.x_end),
        }
    }

    /// A value as it is; a lane's index at the middle of its band, the first on top.
    fn y(&self, v: f64) -> f64 {
        match self.lanes {
            Some(lanes) => (lanes.len() as f64 - v - 0.5).clamp(0.0, self.y_top),
            None => v.clamp(0.0, self.y_top),
        }
    }

    fn points(&self, points: &[(f64, f64)]) -> Vec<(f64, f64)> {
        points
            .iter()
            .map(|&(a, b)| (self.x(a), self.y(b)))
            .collect()
    }

    fn x_axis(&self) -> Axis {
        let ticks = match self.x {
            XAxis::Time { end_ms, .. } => {
                time_ticks(*end_ms).into_iter().map(|t| t as f64).collect()
            }
            XAxis::Categories { labels, .. } => (0..labels.len()).map(|i| i as f64 + 0.5).collect(),
        };
        Axis {
            end: self.x_end,
            ticks,
        }
    }

    fn y_axis(&self) -> Axis {
        let ticks = match self.lanes {
            Some(lanes) => (0..lanes.len()).map(|i| i as f64 + 0.5).collect(),
            None => {
                let steps = (self.y_top / self.y_step).round() as usize;
                (0..=steps).map(|k| self.y_step * k as f64).collect()
            }
        };
        Axis {
            end: self.y_top,
            ticks,
        }
    }

    fn x_label(&self, v: f64) -> String {
        match self.x {
            XAxis::Time { .. } => fmt_tick(v / 1000.0),
            XAxis::Categories { .. } => String::new(),
        }
    }

    fn y_label(&self, v: f64, unit: &str) -> String {
        match self.lanes {
            Some(lanes) => {
                let i = (lanes.len() as f64 - 0.5 - v).round();
                let lane = (i >= 0.0).then(|| lanes.get(i as usize)).flatten();
                lane.cloned().unwrap_or_default()
            }
            None => fmt_tick(v) + unit,
        }
    }
}

fn draw_panel(
    root: &Area<'_>,
    x: &XAxis,
    panel: &Panel,
    top: i32,
    width: i32,
) -> Result<(), BoxError> {
    let mut y = top;
    write(root, &panel.title, (LEFT, y + 10), font(12.5, BLACK).bold())?;
    y += PANEL_TITLE_H;
    if let Some(subtitle) = &panel.subtitle {
        write(root, subtitle, (LEFT, y + 6), font(11.0, LABEL))?;
        y += SUBTITLE_H;
    }
    let frame = Frame::of(x, panel, width);
    let axis_h = axis_height(x);
    let area = root
        .clone()
        .shrink((0, y), (width, PLOT_MARGIN + plot_height(panel) + axis_h));
    let mut c = ChartBuilder::on(&area)
        .margin_top(PLOT_MARGIN)
        .margin_right(RIGHT)
        .x_label_area_size(axis_h)
        .y_label_area_size(LEFT)
        .build_cartesian_2d(frame.x_axis(), frame.y_axis())?;
    // Lanes: alternate stripes, under everything.
    if let Some(lanes) = frame.lanes {
        let n = lanes.len() as f64;
        let stripes = (0..lanes.len()).filter(|i| i % 2 == 0).map(|i| {
            let band = (n - i as f64 - 1.0, n - i as f64);
            Rectangle::new([(0.0, band.0), (frame.x_end, band.1)], STRIPE.filled())
        });
        c.draw_series(stripes)?;
    }
    draw_mesh(&mut c, &frame, panel)?;
    let bar_series = panel
        .series
        .iter()
        .filter(|s| matches!(s.shape, Shape::Bars(_)))
        .count();
    let mut bar_slot = 0;
    for series in &panel.series {
        draw_series(root, &mut c, &frame, series, (bar_slot, bar_series))?;
        if let Shape::Bars(_) = series.shape {
            bar_slot += 1;
        }
    }
    if let Some((note, colour)) = &panel.note {
        let (px, py) = c.backend_coord(&(frame.x_end, frame.y_top));
        let style = font(11.0, rgb(*colour)).right();
        write(root, note, (px - 4, py + 10), style)?;
    }
    Ok(())
}

/// The axes, their ticks, labels and titles, and the grid (horizontal for values,
/// vertical for lanes).
fn draw_mesh(c: &mut Plot<'_, '_>, frame: &Frame<'_>, panel: &Panel) -> Result<(), BoxError> {
    let unit = match &panel.y {
        YAxis::Values { unit, .. } => unit.as_str(),
        YAxis::Lanes(_) => "",
    };
    let x_label = |v: &f64| frame.x_label(*v);
    let y_label = |v: &f64| frame.y_label(*v, unit);
    let mut mesh = c.configure_mesh();
    mesh.axis_style(AXIS)
        .bold_line_style(GRID)
        .light_line_style(TRANSPARENT)
        .label_style(font(11.0, LABEL))
        .axis_desc_style(font(11.0, LABEL))
        .x_label_formatter(&x_label)
        .y_label_formatter(&y_label);
    match frame.x {
        XAxis::Time { title, .. } => {
            mesh.x_desc(title.as_str());
        }
        XAxis::Categories { .. } => {
            // Labelled once, under the last panel.
            let mut none = font(11.0, LABEL);
            none.color = TRANSPARENT.to_backend_color();
            mesh.x_label_style(none);
        }
    }
    match &panel.y {
        YAxis::Values { title, .. } => {
            mesh.disable_x_mesh().y_desc(title.as_str());
        }
        YAxis::Lanes(_) => {
            mesh.disable_y_mesh();
        }
    }
    mesh.draw()?;
    Ok(())
}

/// One series; bars in slot `slot` of `slots` side by side in each group.
fn draw_series(
    root: &Area<'_>,
    c: &mut Plot<'_, '_>,
    frame: &Frame<'_>,
    s: &Series,
    (slot, slots): (usize, usize),
) -> Result<(), BoxError> {
    let colour = rgb(s.colour);
    let style = ShapeStyle {
        color: colour.mix(s.opacity).to_rgba(),
        filled: false,
        stroke_width: s.size.max(1),
    };
    let (px_x, px_y) = frame.px;
    match &s.shape {
        Shape::Line(points) => {
            if !points.is_empty() {
                c.draw_series([PathElement::new(frame.points(points), style)])?;
            }
        }
        Shape::Steps { points, until } => {
            let mut line: Vec<(f64, f64)> = Vec::new();
            for &(a, b) in points {
                if let Some(&(_, level)) = line.last() {
                    line.push((frame.x(a), level));
                }
                line.push((frame.x(a), frame.y(b)));
            }
            if let Some(&(_, level)) = line.last() {
                line.push((frame.x(*until), level));
                c.draw_series([PathElement::new(line, style)])?;
            }
        }
        Shape::Dots(points) => {
            let dots = frame.points(points).into_iter();
            c.draw_series(dots.map(|p| Circle::new(p, s.size, style.filled())))?;
        }
        Shape::Crosses(points) => {
            let crosses = frame.points(points).into_iter();
            c.draw_series(crosses.map(|p| Cross::new(p, s.size, style.stroke_width(2))))?;
        }
        Shape::Spans(spans) => {
            let inset = f64::from(s.size) / f64::from(LANE_H);
            let rect = |span: &Span| {
                let (x0, x1) = (frame.x(span.from), frame.x(span.to));
                let band = match (span.lane, frame.lanes) {
                    (Some(lane), Some(_)) => {
                        let mid = frame.y(lane as f64);
                        (mid - 0.5 + inset, mid + 0.5 - inset)
                    }
                    _ => (0.0, frame.y_top),
                };
                // At least a pixel wide.
                let corners = [(x0, band.0), (x1.max(x0 + px_x), band.1)];
                Rectangle::new(corners, style.filled())
            };
            c.draw_series(spans.iter().map(rect))?;
        }
        Shape::Ticks(xs) => {
            let tick = |t: &f64| {
                let x = frame.x(*t);
                PathElement::new(vec![(x, 0.0), (x, TICK_H * px_y)], style)
            };
            c.draw_series(xs.iter().map(tick))?;
        }
        Shape::Bars(bars) => {
            let w = 0.8 / slots.max(1) as f64;
            for bar in bars {
                let x0 = bar.category as f64 + 0.1 + w * slot as f64;
                // A zero is a visible stub, so that it cannot be mistaken for a missing bar.
                let top = frame.y(bar.value).max(2.0 * px_y);
                let corners = [(x0, top), (x0 + w, 0.0)];
                if bar.hatched {
                    let (a, b) = (c.backend_coord(&corners[0]), c.backend_coord(&corners[1]));
                    hatched(root, colour, a, b)?;
                } else {
                    c.draw_series([Rectangle::new(corners, style.filled())])?;
                }
            }
        }
        Shape::Level(level) => {
            let y = frame.y(*level);
            let line = [(0.0, y), (frame.x_end, y)];
            c.draw_series([DashedPathElement::new(line, 4, 3, style)])?;
            let (px, py) = c.backend_coord(&(frame.x_end, y));
            write(root, &s.label, (px - 2, py - 8), font(11.0, colour).right())?;
        }
    }
    Ok(())
}
