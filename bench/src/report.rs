//! The `BENCH {json}` line every benchmark ends with.

use serde_json::{Map, Value};

/// One measured figure. `extra` carries context such as the number of
/// clients or the block size.
pub(crate) struct Figure<'a> {
    pub(crate) name: &'a str,
    pub(crate) value: f64,
    pub(crate) unit: &'a str,
    pub(crate) target: Option<f64>,
    pub(crate) extra: Vec<(&'a str, Value)>,
}

impl Figure<'_> {
    /// Prints `BENCH {"name":…,"value":…,"unit":…,"target":…}` on stdout.
    pub(crate) fn print(&self) {
        let mut m = Map::new();
        m.insert("name".into(), self.name.into());
        for (k, v) in &self.extra {
            m.insert((*k).into(), v.clone());
        }
        m.insert("value".into(), self.value.into());
        m.insert("unit".into(), self.unit.into());
        m.insert("target".into(), self.target.map_or(Value::Null, Value::from));
        println!("BENCH {}", Value::Object(m));
    }
}
