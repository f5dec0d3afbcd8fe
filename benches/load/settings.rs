//! The bench's settings: flags or their `LOAD_*` variables, checked before anything starts.

use std::path::PathBuf;

use bytes::Bytes;

use crate::scenario::{self, LARGE_FIXTURES, LargeFixture};
use crate::{procfs, proxies};

const SETTINGS: [(&str, &str); 15] = [
    ("--seconds", "LOAD_SECONDS"),
    ("--rate", "LOAD_RATE"),
    ("--large-rate", "LOAD_LARGE_RATE"),
    ("--large", "LOAD_LARGE"),
    ("--phases", "LOAD_PHASES"),
    ("--rounds", "LOAD_ROUNDS"),
    ("--concurrency", "LOAD_CONCURRENCY"),
    ("--body", "LOAD_BODY"),
    ("--path", "LOAD_PATH"),
    ("--extra", "LOAD_CONFIG_EXTRA"),
    ("--nginx", "LOAD_NGINX"),
    ("--pin", "LOAD_PIN"),
    ("--bench-cpu", "LOAD_BENCH_CPU"),
    ("--proxy-cpu", "LOAD_PROXY_CPU"),
    ("--nice", "LOAD_NICE"),
];

pub struct Settings {
    pub seconds: f64,
    pub rate: f64,
    pub large_rate: f64,
    pub large: Vec<&'static LargeFixture>,
    pub phases: Vec<String>,
    /// Rounds of the low-rate phases (`small`, `stream`).
    pub rounds: usize,
    pub concurrency: usize,
    pub body: Bytes,
    pub body_source: String,
    pub path: String,
    pub extra: String,
    pub nginx: Option<PathBuf>,
    /// (bench CPU, proxy CPU), or no pinning.
    pub pins: Option<(usize, usize)>,
    /// The settings given, to print how to run this again.
    pub given: Vec<(&'static str, String)>,
    /// CPUs this process could use before it pinned itself (what `nproc` says).
    pub cpus: usize,
    /// The nice value to run at, if it is to change.
    pub nice: Option<i32>,
}

impl Settings {
    /// `Ok(None)` when a positional filter (as in `cargo bench rewrite`) excludes this bench.
    pub fn load(args: &[String]) -> Result<Option<Self>, String> {
        let mut values: Vec<Option<String>> =
            SETTINGS.iter().map(|(_, env)| std::env::var(env).ok().filter(|v| !v.trim().is_empty())).collect();
        let mut filtered_out = false;
        let mut rest = args.iter();
        while let Some(arg) = rest.next() {
            let (name, inline) = match arg.split_once('=') {
                Some((name, value)) if name.starts_with("--") => (name, Some(value.to_string())),
                _ => (arg.as_str(), None),
            };
            if name == "--bench" {
                continue;
            }
            let Some(slot) = SETTINGS.iter().position(|(flag, _)| *flag == name) else {
                if name.starts_with('-') {
                    let known: Vec<&str> = SETTINGS.iter().map(|(flag, _)| *flag).collect();
                    return Err(format!("unknown argument {name:?} (known: {})", known.join(" ")));
                }
                filtered_out |= !"load".contains(name);
                continue;
            };
            let value = match inline {
                Some(value) => value,
                None => rest.next().cloned().ok_or_else(|| format!("{name} needs a value"))?,
            };
            values[slot] = Some(value);
        }
        if filtered_out {
            return Ok(None);
        }
        let given: Vec<(&'static str, String)> =
            SETTINGS.iter().zip(&values).filter_map(|((_, env), v)| Some((*env, v.clone()?))).collect();
        let value = |env: &str| -> Option<String> {
            SETTINGS.iter().position(|(_, e)| *e == env).and_then(|i| values[i].clone())
        };
        let number = |env: &str, default: f64| -> Result<f64, String> {
            match value(env) {
                None => Ok(default),
                Some(v) => match v.trim().parse::<f64>() {
                    Ok(n) if n.is_finite() && n > 0.0 => Ok(n),
                    _ => Err(format!("{env} must be a positive number, got {v:?}")),
                },
            }
        };
        let seconds = number("LOAD_SECONDS", 10.0)?;
        let rate = number("LOAD_RATE", 50.0)?;
        let large_rate = number("LOAD_LARGE_RATE", 20.0)?;
        let concurrency = number("LOAD_CONCURRENCY", 32.0)?.round().max(1.0) as usize;
        let rounds = number("LOAD_ROUNDS", 5.0)?.round().max(1.0) as usize;

        let large_list = value("LOAD_LARGE").unwrap_or_else(|| scenario::DEFAULT_LARGE.into());
        let large = match large_list.trim() {
            "none" => Vec::new(),
            "all" => LARGE_FIXTURES.iter().collect(),
            list => list
                .split(',')
                .map(str::trim)
                .filter(|k| !k.is_empty())
                .map(|key| {
                    LARGE_FIXTURES.iter().find(|f| f.key == key).ok_or_else(|| {
                        let known: Vec<&str> = LARGE_FIXTURES.iter().map(|f| f.key).collect();
                        format!("LOAD_LARGE: unknown conversation {key:?} (known: {}, all, none)", known.join(", "))
                    })
                })
                .collect::<Result<_, _>>()?,
        };
        let all_phases = ["small", "stream", "closed", "large"];
        let phases: Vec<String> = match value("LOAD_PHASES") {
            None => all_phases.iter().map(|p| p.to_string()).collect(),
            Some(list) => list.split(',').map(|p| p.trim().to_string()).filter(|p| !p.is_empty()).collect(),
        };
        if let Some(unknown) = phases.iter().find(|p| !all_phases.contains(&p.as_str())) {
            return Err(format!("LOAD_PHASES: unknown phase {unknown:?} (known: {})", all_phases.join(", ")));
        }

        let (body, body_source) = match value("LOAD_BODY") {
            Some(file) => {
                let bytes = std::fs::read(&file).map_err(|e| format!("cannot read body {file:?}: {e}"))?;
                (Bytes::from(bytes), file)
            }
            None => (Bytes::from_static(scenario::SMALL_BODY.as_bytes()), "the small chat body".into()),
        };
        let path = value("LOAD_PATH").unwrap_or_else(|| "/v1/chat/completions".into());
        if !path.starts_with('/') {
            return Err(format!("LOAD_PATH must start with '/', got {path:?}"));
        }
        let nginx = proxies::find_nginx(value("LOAD_NGINX").as_deref())?;
        let pins = Self::pins(value("LOAD_PIN"), value("LOAD_BENCH_CPU"), value("LOAD_PROXY_CPU"))?;
        let nice = match value("LOAD_NICE") {
            None => procfs::is_root().then_some(-20),
            Some(v) => match v.trim().parse::<i32>() {
                Ok(n) if (-20..=19).contains(&n) => Some(n),
                _ => return Err(format!("LOAD_NICE must be a nice value from -20 to 19, got {v:?}")),
            },
        };
        Ok(Some(Self {
            seconds,
            rate,
            large_rate,
            large,
            phases,
            rounds,
            concurrency,
            body,
            body_source,
            path,
            extra: value("LOAD_CONFIG_EXTRA").unwrap_or_default(),
            nginx,
            pins,
            given,
            cpus: procfs::allowed_cpus().len(),
            nice,
        }))
    }

    /// The bench's CPU and the proxies' CPU: two different CPUs this process may use.
    pub fn pins(
        pin: Option<String>,
        bench: Option<String>,
        proxy: Option<String>,
    ) -> Result<Option<(usize, usize)>, String> {
        match pin.as_deref().map(str::trim) {
            None | Some("on") => {}
            Some("off") => return Ok(None),
            Some(other) => return Err(format!("LOAD_PIN must be on or off, got {other:?}")),
        }
        let allowed = procfs::allowed_cpus();
        let cpu = |env: &str, value: Option<String>, default: Option<usize>| -> Result<Option<usize>, String> {
            match value {
                None => Ok(default),
                Some(v) => match v.trim().parse::<usize>() {
                    Ok(cpu) if allowed.contains(&cpu) => Ok(Some(cpu)),
                    _ => Err(format!("{env} must be one of the CPUs this process may use ({allowed:?}), got {v:?}")),
                },
            }
        };
        let bench = cpu("LOAD_BENCH_CPU", bench, allowed.first().copied())?;
        let proxy = cpu("LOAD_PROXY_CPU", proxy, allowed.last().copied())?;
        match (bench, proxy) {
            (Some(bench), Some(proxy)) if bench != proxy => Ok(Some((bench, proxy))),
            (Some(_), Some(_)) if allowed.len() < 2 => {
                eprintln!("load bench: only one CPU available: nothing pinned, figures are not comparable");
                Ok(None)
            }
            (Some(cpu), Some(_)) => Err(format!("LOAD_BENCH_CPU and LOAD_PROXY_CPU are both {cpu}")),
            _ => Ok(None),
        }
    }

    pub fn has(&self, phase: &str) -> bool {
        self.phases.iter().any(|p| p == phase)
    }
}
