//! Control messages (layer re-assignment) as Python sees them: the
//! library's `ControlMessage`, encoded and decoded by the library.

use leap_common::control::{
    CONTROL_FRAME_MIN, ControlError, ControlMessage, ControlType as Type, LayerRange, MAX_WORKERS,
};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::errors;

/// What a control message asks.
#[pyclass(module = "leap", eq, eq_int, frozen, from_py_object)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ControlType {
    /// One worker changes its layers (`split_layer`, `end_layer`, `is_tail`).
    #[pyo3(name = "RESIZE_LAYERS")]
    ResizeLayers = 1,
    /// Every worker takes `ranges[worker_index]` and forwards.
    #[pyo3(name = "RESIZE_CHAIN")]
    ResizeChain = 2,
    /// The tail's answer to a RESIZE_CHAIN, travelling back to the head.
    #[pyo3(name = "ACK")]
    Ack = 3,
}

impl ControlType {
    fn name(self) -> &'static str {
        match self {
            Self::ResizeLayers => "RESIZE_LAYERS",
            Self::ResizeChain => "RESIZE_CHAIN",
            Self::Ack => "ACK",
        }
    }
}

impl From<Type> for ControlType {
    fn from(t: Type) -> Self {
        match t {
            Type::ResizeLayers => Self::ResizeLayers,
            Type::ResizeChain => Self::ResizeChain,
            Type::Ack => Self::Ack,
        }
    }
}

impl From<ControlType> for Type {
    fn from(t: ControlType) -> Self {
        match t {
            ControlType::ResizeLayers => Self::ResizeLayers,
            ControlType::ResizeChain => Self::ResizeChain,
            ControlType::Ack => Self::Ack,
        }
    }
}

/// A control message: what the original engine's 0xC0DE frames carry.
///
/// `ranges` holds one `(start_layer, end_layer, is_tail)` per worker (at
/// most 16; `total_workers` is their number).
#[pyclass(module = "leap", from_py_object)]
#[derive(Clone, Debug)]
pub struct Control {
    /// What the message asks.
    #[pyo3(get, set)]
    kind: ControlType,
    /// RESIZE_LAYERS: first layer.
    #[pyo3(get, set)]
    split_layer: i32,
    /// RESIZE_LAYERS: end layer.
    #[pyo3(get, set)]
    end_layer: i32,
    /// RESIZE_LAYERS: the receiver becomes the tail.
    #[pyo3(get, set)]
    is_tail: bool,
    /// RESIZE_CHAIN: index of the worker that reads this message.
    #[pyo3(get, set)]
    worker_index: i32,
    /// RESIZE_CHAIN: one range per worker.
    #[pyo3(get, set)]
    ranges: Vec<(i32, i32, bool)>,
}

impl Control {
    fn from_message(m: &ControlMessage) -> Self {
        let n = usize::try_from(m.total_workers).unwrap_or(0).min(MAX_WORKERS);
        Self {
            kind: m.kind.into(),
            split_layer: m.split_layer,
            end_layer: m.end_layer,
            is_tail: m.is_tail,
            worker_index: m.worker_index,
            ranges: m.ranges[..n].iter().map(|r| (r.start_layer, r.end_layer, r.is_tail)).collect(),
        }
    }

    /// The library's message.
    ///
    /// # Errors
    ///
    /// `ControlError` for more than 16 ranges or fields that do not go
    /// together (the library's check).
    pub fn message(&self) -> PyResult<ControlMessage> {
        if self.ranges.len() > MAX_WORKERS {
            return Err(errors::control(format!("{} ranges: at most {MAX_WORKERS}", self.ranges.len())));
        }
        let mut m = ControlMessage::new(self.kind.into());
        m.split_layer = self.split_layer;
        m.end_layer = self.end_layer;
        m.is_tail = self.is_tail;
        m.worker_index = self.worker_index;
        m.total_workers = self.ranges.len() as i32;
        for (slot, &(start_layer, end_layer, is_tail)) in m.ranges.iter_mut().zip(&self.ranges) {
            *slot = LayerRange { start_layer, end_layer, is_tail };
        }
        m.validate().map_err(|e| errors::control(format!("invalid control message: {}", describe(e))))?;
        Ok(m)
    }

    /// Decodes the start of a frame.
    ///
    /// # Errors
    ///
    /// `ControlError` naming what is wrong.
    pub fn decode_bytes(b: &[u8]) -> PyResult<Self> {
        ControlMessage::decode(b)
            .map(|m| Self::from_message(&m))
            .map_err(|e| errors::control(format!("not a control message: {}", describe(e))))
    }

    /// A message from `obj`: a `Control`, or a dict of its fields.
    ///
    /// # Errors
    ///
    /// `TypeError` for anything else, as `Control(**dict)` for a dict.
    pub fn from_object(obj: &Bound<'_, PyAny>) -> PyResult<ControlMessage> {
        if let Ok(c) = obj.cast::<Control>() {
            return c.borrow().message();
        }
        if let Ok(d) = obj.cast::<PyDict>() {
            let cls = obj.py().get_type::<Control>();
            let c = cls.call((), Some(d))?;
            return c.cast::<Control>()?.borrow().message();
        }
        Err(pyo3::exceptions::PyTypeError::new_err(format!(
            "a control message is a leap.Control or a dict of its fields, not {}",
            obj.get_type().name()?
        )))
    }
}

fn describe(e: ControlError) -> String {
    match e {
        ControlError::Short => format!("shorter than {CONTROL_FRAME_MIN} bytes"),
        ControlError::NoMarker => "no 0xC0DE marker (or padding that is not zero)".into(),
        ControlError::BadType(t) => format!("type byte {t} (1, 2 or 3)"),
        ControlError::BadBool => "a boolean byte other than 0 or 1".into(),
        ControlError::BadWorkers => "total_workers outside 0..=16 or worker_index outside 0..=total_workers".into(),
        ControlError::BadRange => "a negative layer or a range whose start is after its end".into(),
    }
}

#[pymethods]
impl Control {
    #[new]
    #[pyo3(signature = (kind, *, split_layer = 0, end_layer = 0, is_tail = false, worker_index = 0, ranges = Vec::new()))]
    fn py_new(
        kind: ControlType,
        split_layer: i32,
        end_layer: i32,
        is_tail: bool,
        worker_index: i32,
        ranges: Vec<(i32, i32, bool)>,
    ) -> Self {
        Self { kind, split_layer, end_layer, is_tail, worker_index, ranges }
    }

    /// Number of ranges.
    #[getter]
    fn total_workers(&self) -> usize {
        self.ranges.len()
    }

    /// Decodes a control message from the start of `frame` (bytes or any
    /// buffer).
    ///
    /// Raises `ControlError` when it is not one.
    #[staticmethod]
    fn decode(frame: &Bound<'_, PyAny>) -> PyResult<Self> {
        let held = crate::buffer::Held::new(frame, false, "Control.decode")?;
        Self::decode_bytes(held.bytes())
    }

    /// The control frame: marker and message padded with zeros to
    /// `frame_len` bytes (at least 164).
    fn encode<'py>(&self, py: Python<'py>, frame_len: usize) -> PyResult<Bound<'py, PyBytes>> {
        let m = self.message()?;
        if frame_len < CONTROL_FRAME_MIN {
            return Err(errors::control(format!("a control frame needs {CONTROL_FRAME_MIN} bytes, not {frame_len}")));
        }
        PyBytes::new_with(py, frame_len, |b| {
            b.fill(0);
            m.encode(b).map_err(|e| errors::control(describe(e)))
        })
    }

    /// The fields as a dict (what `Control(**d)` takes).
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("kind", self.kind)?;
        d.set_item("split_layer", self.split_layer)?;
        d.set_item("end_layer", self.end_layer)?;
        d.set_item("is_tail", self.is_tail)?;
        d.set_item("worker_index", self.worker_index)?;
        d.set_item("ranges", self.ranges.clone())?;
        Ok(d)
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other.cast::<Control>().is_ok_and(|o| {
            let o = o.borrow();
            (o.kind, o.split_layer, o.end_layer, o.is_tail, o.worker_index, &o.ranges)
                == (self.kind, self.split_layer, self.end_layer, self.is_tail, self.worker_index, &self.ranges)
        })
    }

    fn __repr__(&self) -> String {
        let py_bool = |b: bool| if b { "True" } else { "False" };
        let ranges: Vec<String> = self.ranges.iter().map(|&(s, e, t)| format!("({s}, {e}, {})", py_bool(t))).collect();
        format!(
            "leap.Control(ControlType.{}, split_layer={}, end_layer={}, is_tail={}, worker_index={}, ranges=[{}])",
            self.kind.name(),
            self.split_layer,
            self.end_layer,
            py_bool(self.is_tail),
            self.worker_index,
            ranges.join(", ")
        )
    }
}
