//! The parameters of a compressor (`Spec(name, **params)`): a small map from names to
//! integers, floats, lists of integers or strings. Each sparsifier and quantizer takes the parameters
//! it reads; whatever is left is an unknown parameter (an error naming it).

use std::collections::BTreeMap;

use crate::error::{CoreError, Result};

#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Int(i64),
    Float(f64),
    Ints(Vec<i64>),
    Str(String),
}

impl Value {
    fn kind(&self) -> &'static str {
        match self {
            Value::Int(_) => "an integer",
            Value::Float(_) => "a float",
            Value::Ints(_) => "a list of integers",
            Value::Str(_) => "a string",
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Params {
    map: BTreeMap<String, Value>,
}

impl Params {
    pub fn new() -> Self {
        Params::default()
    }

    /// Adds (or replaces) a parameter; builder style.
    pub fn with(mut self, key: &str, value: Value) -> Self {
        self.insert(key, value);
        self
    }

    pub fn insert(&mut self, key: &str, value: Value) {
        self.map.insert(key.to_string(), value);
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Takes an integer in `[low, high]`.
    pub fn take_int(&mut self, key: &str, low: i64, high: i64) -> Result<Option<i64>> {
        match self.map.remove(key) {
            None => Ok(None),
            Some(Value::Int(v)) if (low..=high).contains(&v) => Ok(Some(v)),
            Some(Value::Int(v)) if v < low => {
                Err(CoreError::invalid(key, format!("must be at least {low}, got {v}")))
            }
            Some(Value::Int(v)) => Err(CoreError::invalid(key, format!("must be at most {high}, got {v}"))),
            Some(other) => Err(CoreError::wrong_type(key, format!("must be an integer, got {}", other.kind()))),
        }
    }

    /// Takes a count (`usize`) that is at least `low`.
    pub fn take_count(&mut self, key: &str, low: usize) -> Result<Option<usize>> {
        let high = i64::try_from(usize::MAX).unwrap_or(i64::MAX);
        Ok(self.take_int(key, low as i64, high)?.map(|v| v as usize))
    }

    /// Takes a finite float (an integer is converted; NaN or ±inf is an error naming `key`).
    pub fn take_float(&mut self, key: &str) -> Result<Option<f64>> {
        match self.map.remove(key) {
            None => Ok(None),
            Some(Value::Float(v)) => CoreError::finite(key, v).map(Some),
            Some(Value::Int(v)) => Ok(Some(v as f64)),
            Some(other) => Err(CoreError::wrong_type(key, format!("must be a float, got {}", other.kind()))),
        }
    }

    /// Takes a list of integers.
    pub fn take_ints(&mut self, key: &str) -> Result<Option<Vec<i64>>> {
        match self.map.remove(key) {
            None => Ok(None),
            Some(Value::Ints(v)) => Ok(Some(v)),
            Some(other) => Err(CoreError::wrong_type(key, format!("must be a list of integers, got {}", other.kind()))),
        }
    }

    /// Takes a string.
    pub fn take_str(&mut self, key: &str) -> Result<Option<String>> {
        match self.map.remove(key) {
            None => Ok(None),
            Some(Value::Str(v)) => Ok(Some(v)),
            Some(other) => Err(CoreError::wrong_type(key, format!("must be a string, got {}", other.kind()))),
        }
    }

    /// Fails on the first parameter nobody took. `owner` describes who was asked and `known`
    /// lists the parameters it takes.
    pub fn finish(self, owner: &str, known: &[&str]) -> Result<()> {
        match self.map.keys().next() {
            None => Ok(()),
            Some(key) => {
                let takes = if known.is_empty() { "no parameters".to_string() } else { known.join(", ") };
                Err(CoreError::invalid(key.clone(), format!("unknown parameter {key:?} for {owner} (it takes {takes})")))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_are_taken_by_kind() {
        let mut p = Params::new().with("k", Value::Int(3)).with("s", Value::Float(1.5)).with("labels", Value::Ints(vec![0, 1]));
        assert!(matches!(p.take_count("s", 1), Err(CoreError::WrongType { .. })));
        assert_eq!(p.take_count("k", 1).unwrap(), Some(3));
        assert_eq!(p.take_count("k", 1).unwrap(), None);
        assert_eq!(p.take_ints("labels").unwrap(), Some(vec![0, 1]));
        let mut t = Params::new().with("sampler", Value::Str("shuffle".into())).with("k", Value::Int(1));
        assert!(matches!(t.take_str("k"), Err(CoreError::WrongType { .. })));
        assert_eq!(t.take_str("sampler").unwrap(), Some("shuffle".to_string()));
        assert!(p.clone().finish("x", &[]).is_ok());
        let mut q = Params::new().with("k", Value::Int(0)).with("bogus", Value::Int(1));
        assert!(matches!(q.take_count("k", 1), Err(CoreError::InvalidArgument { name, .. }) if name == "k"));
        let err = q.finish("sparsifier \"permk\"", &[]).unwrap_err();
        assert!(err.to_string().starts_with("bogus: unknown parameter"), "{err}");
        let mut f = Params::new().with("s", Value::Float(0.5)).with("t", Value::Float(f64::NAN)).with("u", Value::Float(f64::INFINITY)).with("i", Value::Int(2));
        assert_eq!(f.take_float("s").unwrap(), Some(0.5));
        assert_eq!(f.take_float("i").unwrap(), Some(2.0));
        for key in ["t", "u"] {
            assert!(matches!(f.take_float(key), Err(CoreError::InvalidArgument { name, .. }) if name == key));
        }
    }
}
