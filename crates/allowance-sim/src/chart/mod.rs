//! Charts as SVG: what to draw (a [`Chart`] of [`Panel`]s stacked on one x axis, each
//! holding [`Series`]) apart from how (one renderer, on plotters' SVG backend).
//!
//! Every picture the simulator draws is one of these: the [`timeline`](crate::timeline)
//! (one lane per worker, a dot per attempt, shaded waits), the
//! [`rate_chart`](crate::rate_chart) (rates over time, a tick per 429) and the
//! [`sweep`](crate::sweep)'s grouped bars. A new chart takes a few lines:
//!
//! ```
//! use allowance_sim::chart::{Chart, Colour, Panel, Series, Span, XAxis};
//!
//! let mut panel = Panel::values("requests per second").title("one run");
//! panel.push(Series::line("rate", Colour::BLUE, vec![(0.0, 2.0), (1_000.0, 4.0), (3_000.0, 4.0)]));
//! panel.push(Series::spans("cooldown", Colour::AMBER, vec![Span::new(500.0, 1_500.0)]));
//! panel.push(Series::ticks("a 429", Colour::RED, vec![500.0]));
//! let svg = Chart::new(XAxis::time(3_000)).panel(panel).svg()?;
//! assert!(svg.contains("requests per second") && svg.contains("cooldown"));
//! # Ok::<(), tower_allowance::BoxError>(())
//! ```
//!
//! Times are milliseconds, labelled in seconds. The legend is drawn from the series' labels
//! (the first series of each label gives its swatch), plus [`Chart::legend_entry`]s. Values
//! outside an axis are drawn at its edge.

mod svg;

/// An RGB colour, `0xRRGGBB`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Colour(pub u32);

impl Colour {
    /// A success (`#2e9e44`).
    pub const GREEN: Self = Self(0x2e9e44);
    /// A 429 (`#d62728`).
    pub const RED: Self = Self(0xd62728);
    /// The allowance (`#1f77b4`).
    pub const BLUE: Self = Self(0x1f77b4);
    /// A wait (`#f5b700`).
    pub const AMBER: Self = Self(0xf5b700);
    /// Anything else (`#7f7f7f`).
    pub const GREY: Self = Self(0x7f7f7f);
    /// A limit (`#555555`).
    pub const DARK_GREY: Self = Self(0x555555);
    /// An end (`#000000`).
    pub const BLACK: Self = Self(0x000000);

    /// The colour as `#RRGGBB`, as the SVG writes it.
    pub fn hex(self) -> String {
        format!("#{:06X}", self.0 & 0xff_ffff)
    }

    fn rgb(self) -> (u8, u8, u8) {
        let [_, r, g, b] = self.0.to_be_bytes();
        (r, g, b)
    }
}

/// The x axis, shared by every panel.
#[derive(Clone, Debug, PartialEq)]
pub enum XAxis {
    /// Milliseconds from 0 to `end_ms`, labelled in seconds under every panel.
    Time {
        /// The right edge, ms.
        end_ms: u64,
        /// The axis title.
        title: String,
    },
    /// One group per label (x = the label's index), labelled once, under the last panel;
    /// a label's lines are separated by `\n`.
    Categories {
        /// The groups' labels.
        labels: Vec<String>,
        /// The axis title.
        title: String,
    },
}

impl XAxis {
    /// Time from 0 to `end_ms`, titled "seconds since the start".
    pub fn time(end_ms: u64) -> Self {
        Self::Time {
            end_ms: end_ms.max(1),
            title: "seconds since the start".to_owned(),
        }
    }

    /// One group per label.
    pub fn categories(labels: Vec<String>, title: impl Into<String>) -> Self {
        Self::Categories {
            labels,
            title: title.into(),
        }
    }
}

/// A panel's y axis.
#[derive(Clone, Debug, PartialEq)]
pub enum YAxis {
    /// Values from 0 to a round top (see [`axis_ticks`]) covering `max`, or the data's
    /// largest value (at least 1) when `max` is `None`.
    Values {
        /// The axis title.
        title: String,
        /// The value the axis must reach.
        max: Option<f64>,
        /// Written after each tick label (`"%"`).
        unit: String,
    },
    /// One lane per label, the first at the top: a point's y is its lane's index.
    Lanes(Vec<String>),
}

/// A span of x, shaded: in one lane, or across the panel.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Span {
    /// Where it starts.
    pub from: f64,
    /// Where it ends.
    pub to: f64,
    /// The lane it shades (on a [`YAxis::Lanes`] panel); the whole height when `None`.
    pub lane: Option<usize>,
}

impl Span {
    /// A span across the whole panel.
    pub fn new(from: f64, to: f64) -> Self {
        Self {
            from,
            to,
            lane: None,
        }
    }

    /// A span in one lane.
    pub fn in_lane(from: f64, to: f64, lane: usize) -> Self {
        Self {
            from,
            to,
            lane: Some(lane),
        }
    }
}

/// One bar of a [`Shape::Bars`] series.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bar {
    /// The group ([`XAxis::Categories`] index) it stands in.
    pub category: usize,
    /// Its height; 0 is drawn as a stub, so that it is not mistaken for a missing bar.
    pub value: f64,
    /// Drawn hatched: the value means something else (say so in a legend entry).
    pub hatched: bool,
}

/// What a series draws.
#[derive(Clone, Debug, PartialEq)]
pub enum Shape {
    /// A line through `(x, y)` points.
    Line(Vec<(f64, f64)>),
    /// A step line: each point starts a level, the last one held until `until`.
    Steps {
        /// Where each level starts, and its value.
        points: Vec<(f64, f64)>,
        /// Where the last level ends.
        until: f64,
    },
    /// A dot at each point.
    Dots(Vec<(f64, f64)>),
    /// A cross at each point.
    Crosses(Vec<(f64, f64)>),
    /// Shaded spans.
    Spans(Vec<Span>),
    /// A short mark at the foot of the panel at each x: events.
    Ticks(Vec<f64>),
    /// Bars, side by side with the panel's other bar series in each group.
    Bars(Vec<Bar>),
    /// A dashed reference line at this y, its label written at its right end (not in the
    /// legend).
    Level(f64),
}

/// One series: a shape in one colour, with a legend label.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    /// Its legend label (none when empty).
    pub label: String,
    /// Its colour.
    pub colour: Colour,
    /// Its opacity, 0 to 1.
    pub opacity: f64,
    /// In pixels: a line's width, a dot's radius, a cross's half-width, a span's inset from
    /// its lane's edges.
    pub size: u32,
    /// What it draws.
    pub shape: Shape,
}

impl Series {
    fn new(label: impl Into<String>, colour: Colour, size: u32, shape: Shape) -> Self {
        Self {
            label: label.into(),
            colour,
            opacity: 1.0,
            size,
            shape,
        }
    }

    /// A line, 2 px wide.
    pub fn line(label: impl Into<String>, colour: Colour, points: Vec<(f64, f64)>) -> Self {
        Self::new(label, colour, 2, Shape::Line(points))
    }

    /// A step line, 2 px wide: each point starts a level, the last one held until `until`.
    pub fn steps(
        label: impl Into<String>,
        colour: Colour,
        points: Vec<(f64, f64)>,
        until: f64,
    ) -> Self {
        Self::new(label, colour, 2, Shape::Steps { points, until })
    }

    /// Dots of radius 4.
    pub fn dots(label: impl Into<String>, colour: Colour, points: Vec<(f64, f64)>) -> Self {
        Self::new(label, colour, 4, Shape::Dots(points))
    }

    /// Crosses 10 px wide.
    pub fn crosses(label: impl Into<String>, colour: Colour, points: Vec<(f64, f64)>) -> Self {
        Self::new(label, colour, 5, Shape::Crosses(points))
    }

    /// Spans shaded at opacity 0.2.
    pub fn spans(label: impl Into<String>, colour: Colour, spans: Vec<Span>) -> Self {
        Self::new(label, colour, 0, Shape::Spans(spans)).opacity(0.2)
    }

    /// Event ticks, 1 px wide.
    pub fn ticks(label: impl Into<String>, colour: Colour, xs: Vec<f64>) -> Self {
        Self::new(label, colour, 1, Shape::Ticks(xs))
    }

    /// Bars.
    pub fn bars(label: impl Into<String>, colour: Colour, bars: Vec<Bar>) -> Self {
        Self::new(label, colour, 0, Shape::Bars(bars))
    }

    /// A dashed reference line at `y`, labelled at its right end.
    pub fn level(label: impl Into<String>, y: f64) -> Self {
        Self::new(label, Colour::DARK_GREY, 1, Shape::Level(y))
    }

    /// With this opacity.
    pub fn opacity(mut self, opacity: f64) -> Self {
        self.opacity = opacity.clamp(0.0, 1.0);
        self
    }

    /// With this size (see [`Series::size`](Series#structfield.size)).
    pub fn size(mut self, size: u32) -> Self {
        self.size = size;
        self
    }

    /// How many points, spans, ticks or bars it has (1 for a level).
    pub fn len(&self) -> usize {
        match &self.shape {
            Shape::Line(p) | Shape::Dots(p) | Shape::Crosses(p) => p.len(),
            Shape::Steps { points, .. } => points.len(),
            Shape::Spans(s) => s.len(),
            Shape::Ticks(t) => t.len(),
            Shape::Bars(b) => b.len(),
            Shape::Level(_) => 1,
        }
    }

    /// Whether it draws nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Its legend swatch.
    pub fn swatch(&self) -> Swatch {
        let c = self.colour;
        match &self.shape {
            Shape::Line(_) | Shape::Steps { .. } | Shape::Level(_) => Swatch::Line(c, self.size),
            Shape::Dots(_) => Swatch::Dot(c),
            Shape::Crosses(_) => Swatch::Cross(c),
            Shape::Spans(_) => Swatch::Block(c, self.opacity),
            Shape::Ticks(_) => Swatch::Tick(c),
            Shape::Bars(_) => Swatch::Block(c, 1.0),
        }
    }
}

/// What a legend entry shows before its label.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Swatch {
    /// A line this wide.
    Line(Colour, u32),
    /// A dot.
    Dot(Colour),
    /// A cross.
    Cross(Colour),
    /// A square at this opacity.
    Block(Colour, f64),
    /// A hatched square (a [`Bar::hatched`] bar).
    Hatched(Colour),
    /// An event tick.
    Tick(Colour),
}

/// One panel: a titled plot with its own y axis.
#[derive(Clone, Debug, PartialEq)]
pub struct Panel {
    /// Its title, in bold above it.
    pub title: String,
    /// A line under the title.
    pub subtitle: Option<String>,
    /// Its y axis.
    pub y: YAxis,
    /// Drawn in order, each over the ones before.
    pub series: Vec<Series>,
    /// A remark in the top right corner of the plot, in a colour.
    pub note: Option<(String, Colour)>,
}

impl Panel {
    fn new(y: YAxis) -> Self {
        Self {
            title: String::new(),
            subtitle: None,
            y,
            series: Vec::new(),
            note: None,
        }
    }

    /// A panel of values from 0, its y axis titled `title`.
    pub fn values(title: impl Into<String>) -> Self {
        Self::new(YAxis::Values {
            title: title.into(),
            max: None,
            unit: String::new(),
        })
    }

    /// A panel of lanes, one per label, the first at the top.
    pub fn lanes(labels: Vec<String>) -> Self {
        Self::new(YAxis::Lanes(labels))
    }

    /// With this title.
    pub fn title(mut self, title: impl Into<String>) -> Self {
        self.title = title.into();
        self
    }

    /// With this line under the title.
    pub fn subtitle(mut self, subtitle: impl Into<String>) -> Self {
        self.subtitle = Some(subtitle.into());
        self
    }

    /// With a y axis reaching at least `max` (values above the axis are drawn at its top).
    pub fn y_max(mut self, max: f64) -> Self {
        if let YAxis::Values { max: m, .. } = &mut self.y {
            *m = Some(max);
        }
        self
    }

    /// With `unit` after each y tick label.
    pub fn y_unit(mut self, unit: impl Into<String>) -> Self {
        if let YAxis::Values { unit: u, .. } = &mut self.y {
            *u = unit.into();
        }
        self
    }

    /// With a remark in the plot's top right corner.
    pub fn note(mut self, text: impl Into<String>, colour: Colour) -> Self {
        self.note = Some((text.into(), colour));
        self
    }

    /// Adds a series, drawn over the ones before.
    pub fn push(&mut self, series: Series) {
        self.series.push(series);
    }

    /// The first series labelled `label`.
    pub fn series(&self, label: &str) -> Option<&Series> {
        self.series.iter().find(|s| s.label == label)
    }

    /// The y axis's top and tick step, from 0 (lanes: one per lane).
    pub fn y_ticks(&self) -> (f64, f64) {
        match &self.y {
            YAxis::Lanes(lanes) => (lanes.len().max(1) as f64, 1.0),
            YAxis::Values { max: Some(max), .. } => axis_ticks(*max),
            YAxis::Values { max: None, .. } => {
                let most = self.series.iter().map(largest).fold(1.0, f64::max);
                axis_ticks(most)
            }
        }
    }
}

/// The largest y a series reaches.
fn largest(s: &Series) -> f64 {
    let of = |p: &[(f64, f64)]| p.iter().map(|(_, y)| *y).fold(0.0, f64::max);
    match &s.shape {
        Shape::Line(p) | Shape::Dots(p) | Shape::Crosses(p) => of(p),
        Shape::Steps { points, .. } => of(points),
        Shape::Bars(b) => b.iter().map(|b| b.value).fold(0.0, f64::max),
        Shape::Level(y) => *y,
        Shape::Spans(_) | Shape::Ticks(_) => 0.0,
    }
}

/// A chart: a title, a legend, panels stacked on one x axis, and a caption.
#[derive(Clone, Debug, PartialEq)]
pub struct Chart {
    /// Its title, in bold at the top.
    pub title: Option<String>,
    /// The x axis every panel shares.
    pub x: XAxis,
    /// The panels, top to bottom.
    pub panels: Vec<Panel>,
    /// Legend entries after the series' own.
    pub extra_legend: Vec<(Swatch, String)>,
    /// Paragraphs under the chart, wrapped to its width.
    pub caption: Vec<String>,
}

impl Chart {
    /// An empty chart on this x axis.
    pub fn new(x: XAxis) -> Self {
        Self {
            title: None,
            x,
            panels: Vec::new(),
            extra_legend: Vec::new(),
            caption: Vec::new(),
        }
    }

    /// With this title.
    pub fn title(mut self, title: impl Into<String>) -> Self {
        self.title = Some(title.into());
        self
    }

    /// With this panel under the others.
    pub fn panel(mut self, panel: Panel) -> Self {
        self.panels.push(panel);
        self
    }

    /// With a legend entry of its own (after the series').
    pub fn legend_entry(mut self, swatch: Swatch, label: impl Into<String>) -> Self {
        self.extra_legend.push((swatch, label.into()));
        self
    }

    /// With these paragraphs under the chart.
    pub fn caption(mut self, paragraphs: Vec<String>) -> Self {
        self.caption = paragraphs;
        self
    }

    /// The legend: each label of the panels' series once (levels aside), in the order
    /// first drawn, then the extra entries.
    pub fn legend(&self) -> Vec<(Swatch, &str)> {
        let mut out: Vec<(Swatch, &str)> = Vec::new();
        let series = self.panels.iter().flat_map(|p| &p.series);
        for s in series.filter(|s| !matches!(s.shape, Shape::Level(_))) {
            if !s.label.is_empty() && out.iter().all(|(_, l)| *l != s.label) {
                out.push((s.swatch(), &s.label));
            }
        }
        out.extend(self.extra_legend.iter().map(|(w, l)| (*w, l.as_str())));
        out
    }

    /// The chart as an SVG document (text as `<text>` elements: no font is read).
    ///
    /// # Errors
    ///
    /// plotters could not lay the chart out.
    pub fn svg(&self) -> Result<String, tower_allowance::BoxError> {
        svg::render(self)
    }
}

/// A y axis from 0 to `top` in steps of `step`: the smallest "nice" step (1, 2, 2.5 or 5
/// times a power of ten) that covers `max` in at most 6 steps.
///
/// ```
/// use allowance_sim::chart::axis_ticks;
///
/// assert_eq!(axis_ticks(9.79), (10.0, 2.0));
/// assert_eq!(axis_ticks(5.0), (5.0, 1.0));
/// assert_eq!(axis_ticks(1.0), (1.0, 0.2));
/// ```
pub fn axis_ticks(max: f64) -> (f64, f64) {
    let max = if max.is_finite() && max > 0.0 {
        max
    } else {
        1.0
    };
    let mut magnitude = 10f64.powf((max / 6.0).log10().floor());
    loop {
        for m in [1.0, 2.0, 2.5, 5.0] {
            let step = m * magnitude;
            let steps = (max / step - 1e-9).ceil().max(1.0);
            if steps <= 6.0 {
                // Rounded to a millionth: 6 x 0.2 is 1.2, not 1.2000000000000002.
                let round = |x: f64| (x * 1e6).round() / 1e6;
                return (round(steps * step), round(step));
            }
        }
        magnitude *= 10.0;
    }
}

/// The time ticks for an axis to `end_ms`: every 0.5, 1, 2, 5, 10, 15 or 30 s, or 1 or 5
/// min, whichever gives at most 12 steps; beyond an hour, a multiple of 10 min that does.
pub fn time_ticks(end_ms: u64) -> Vec<u64> {
    let step = [
        500, 1_000, 2_000, 5_000, 10_000, 15_000, 30_000, 60_000, 300_000,
    ]
    .into_iter()
    .find(|step| end_ms / step <= 12)
    .unwrap_or_else(|| end_ms.div_ceil(12).div_ceil(600_000) * 600_000);
    (0..=end_ms / step).map(|i| i * step).collect()
}

/// A tick label: an integer without decimals, otherwise at most two.
pub fn fmt_tick(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 {
        format!("{v:.0}")
    } else {
        let s = format!("{v:.2}");
        s.trim_end_matches('0').to_owned()
    }
}

/// Greedy word wrap at `width` characters.
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
}
