//! ggml's tensor element types and op ids (values from ggml.h, version 0.26.0), with the
//! block size and byte size of every type the library can store.

/// A ggml tensor element type (`enum ggml_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(i32)]
#[allow(non_camel_case_types)]
pub enum GgmlType {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q8_1 = 9,
    Q2_K = 10,
    Q3_K = 11,
    Q4_K = 12,
    Q5_K = 13,
    Q6_K = 14,
    Q8_K = 15,
    IQ2_XXS = 16,
    IQ2_XS = 17,
    IQ3_XXS = 18,
    IQ1_S = 19,
    IQ4_NL = 20,
    IQ3_S = 21,
    IQ2_S = 22,
    IQ4_XS = 23,
    IQ1_M = 29,
    TQ1_0 = 34,
    TQ2_0 = 35,
    I8 = 24,
    I16 = 25,
    I32 = 26,
    I64 = 27,
    F64 = 28,
    BF16 = 30,
    MXFP4 = 39,
    NVFP4 = 40,
    Q1_0 = 41,
    Q2_0 = 42,
}

impl GgmlType {
    pub fn from_raw(v: i32) -> Option<GgmlType> {
        use GgmlType::*;
        Some(match v {
            0 => F32,
            1 => F16,
            2 => Q4_0,
            3 => Q4_1,
            6 => Q5_0,
            7 => Q5_1,
            8 => Q8_0,
            9 => Q8_1,
            10 => Q2_K,
            11 => Q3_K,
            12 => Q4_K,
            13 => Q5_K,
            14 => Q6_K,
            15 => Q8_K,
            16 => IQ2_XXS,
            17 => IQ2_XS,
            18 => IQ3_XXS,
            19 => IQ1_S,
            20 => IQ4_NL,
            21 => IQ3_S,
            22 => IQ2_S,
            23 => IQ4_XS,
            29 => IQ1_M,
            34 => TQ1_0,
            35 => TQ2_0,
            24 => I8,
            25 => I16,
            26 => I32,
            27 => I64,
            28 => F64,
            30 => BF16,
            39 => MXFP4,
            40 => NVFP4,
            41 => Q1_0,
            42 => Q2_0,
            _ => return None,
        })
    }

    /// Elements per block (1 for plain types).
    pub fn block_size(self) -> usize {
        use GgmlType::*;
        match self {
            Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q8_1 | IQ4_NL | MXFP4 => 32,
            NVFP4 | Q2_0 => 64,
            Q1_0 => 128,
            Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | Q8_K | IQ4_XS | TQ1_0 | TQ2_0 => 256,
            IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S | IQ1_S | IQ1_M => 256,
            _ => 1,
        }
    }

    /// Bytes per block.
    pub fn type_size(self) -> usize {
        use GgmlType::*;
        match self {
            F32 | I32 => 4,
            F16 | BF16 | I16 => 2,
            I8 => 1,
            I64 | F64 => 8,
            Q4_0 => 18,
            Q4_1 => 20,
            Q5_0 => 22,
            Q5_1 => 24,
            Q8_0 => 34,
            Q8_1 => 36,
            Q2_K => 84,
            Q3_K => 110,
            Q4_K => 144,
            Q5_K => 176,
            Q6_K => 210,
            Q8_K => 292,
            IQ4_NL => 18,
            IQ4_XS => 136,
            IQ2_XXS => 66,
            IQ2_XS => 74,
            IQ2_S => 82,
            IQ3_XXS => 98,
            IQ3_S => 110,
            IQ1_S => 50,
            IQ1_M => 56,
            TQ1_0 => 54,
            TQ2_0 => 66,
            MXFP4 => 17,
            NVFP4 => 36,
            Q1_0 => 18,
            Q2_0 => 18,
        }
    }

    /// Bytes taken by `n` elements of a row (`n` must be a multiple of the block size).
    pub fn row_size(self, n: usize) -> usize {
        n / self.block_size() * self.type_size()
    }

    pub fn is_quantized(self) -> bool {
        self.block_size() > 1
    }

    pub fn name(self) -> &'static str {
        use GgmlType::*;
        match self {
            F32 => "f32",
            F16 => "f16",
            Q4_0 => "q4_0",
            Q4_1 => "q4_1",
            Q5_0 => "q5_0",
            Q5_1 => "q5_1",
            Q8_0 => "q8_0",
            Q8_1 => "q8_1",
            Q2_K => "q2_K",
            Q3_K => "q3_K",
            Q4_K => "q4_K",
            Q5_K => "q5_K",
            Q6_K => "q6_K",
            Q8_K => "q8_K",
            IQ4_NL => "iq4_nl",
            IQ4_XS => "iq4_xs",
            IQ2_XXS => "iq2_xxs",
            IQ2_XS => "iq2_xs",
            IQ2_S => "iq2_s",
            IQ3_XXS => "iq3_xxs",
            IQ3_S => "iq3_s",
            IQ1_S => "iq1_s",
            IQ1_M => "iq1_m",
            TQ1_0 => "tq1_0",
            TQ2_0 => "tq2_0",
            I8 => "i8",
            I16 => "i16",
            I32 => "i32",
            I64 => "i64",
            F64 => "f64",
            BF16 => "bf16",
            MXFP4 => "mxfp4",
            NVFP4 => "nvfp4",
            Q1_0 => "q1_0",
            Q2_0 => "q2_0",
        }
    }
}

/// `enum ggml_op` values used by this library.
pub mod op {
    pub const NONE: i32 = 0;
    pub const DUP: i32 = 1;
    pub const ADD: i32 = 2;
    pub const ADD_ID: i32 = 3;
    pub const ADD1: i32 = 4;
    pub const ACC: i32 = 5;
    pub const SUB: i32 = 6;
    pub const MUL: i32 = 7;
    pub const DIV: i32 = 8;
    pub const SQR: i32 = 9;
    pub const SQRT: i32 = 10;
    pub const LOG: i32 = 11;
    pub const SIN: i32 = 12;
    pub const COS: i32 = 13;
    pub const SUM: i32 = 14;
    pub const SUM_ROWS: i32 = 15;
    pub const CUMSUM: i32 = 16;
    pub const MEAN: i32 = 17;
    pub const ARGMAX: i32 = 18;
    pub const COUNT_EQUAL: i32 = 19;
    pub const REPEAT: i32 = 20;
    pub const CONCAT: i32 = 22;
    pub const NORM: i32 = 24;
    pub const RMS_NORM: i32 = 25;
    pub const GROUP_NORM: i32 = 27;
    pub const L2_NORM: i32 = 28;
    pub const MUL_MAT: i32 = 29;
    pub const MUL_MAT_ID: i32 = 30;
    pub const SCALE: i32 = 32;
    pub const SET: i32 = 33;
    pub const CPY: i32 = 34;
    pub const CONT: i32 = 35;
    pub const RESHAPE: i32 = 36;
    pub const VIEW: i32 = 37;
    pub const PERMUTE: i32 = 38;
    pub const TRANSPOSE: i32 = 39;
    pub const GET_ROWS: i32 = 40;
    pub const SET_ROWS: i32 = 42;
    pub const DIAG_MASK_INF: i32 = 44;
    pub const SOFT_MAX: i32 = 46;
    pub const ROPE: i32 = 48;
    pub const CLAMP: i32 = 50;
    pub const PAD: i32 = 64;
    pub const ARANGE: i32 = 67;
    pub const ARGSORT: i32 = 69;
    pub const TOP_K: i32 = 70;
    pub const LEAKY_RELU: i32 = 71;
    pub const FILL: i32 = 73;
    pub const FLASH_ATTN_EXT: i32 = 74;
    pub const UNARY: i32 = 91;
    pub const GLU: i32 = 100;
    pub const COUNT: i32 = 101;

    /// Names of `enum ggml_op` by value (as `ggml_op_name` prints them), for logs and telemetry.
    const NAMES: [&str; COUNT as usize] = [
        "NONE",
        "DUP",
        "ADD",
        "ADD_ID",
        "ADD1",
        "ACC",
        "SUB",
        "MUL",
        "DIV",
        "SQR",
        "SQRT",
        "LOG",
        "SIN",
        "COS",
        "SUM",
        "SUM_ROWS",
        "CUMSUM",
        "MEAN",
        "ARGMAX",
        "COUNT_EQUAL",
        "REPEAT",
        "REPEAT_BACK",
        "CONCAT",
        "SILU_BACK",
        "NORM",
        "RMS_NORM",
        "RMS_NORM_BACK",
        "GROUP_NORM",
        "L2_NORM",
        "MUL_MAT",
        "MUL_MAT_ID",
        "OUT_PROD",
        "SCALE",
        "SET",
        "CPY",
        "CONT",
        "RESHAPE",
        "VIEW",
        "PERMUTE",
        "TRANSPOSE",
        "GET_ROWS",
        "GET_ROWS_BACK",
        "SET_ROWS",
        "DIAG",
        "DIAG_MASK_INF",
        "DIAG_MASK_ZERO",
        "SOFT_MAX",
        "SOFT_MAX_BACK",
        "ROPE",
        "ROPE_BACK",
        "CLAMP",
        "CONV_TRANSPOSE_1D",
        "IM2COL",
        "IM2COL_BACK",
        "IM2COL_3D",
        "COL2IM_1D",
        "CONV_2D",
        "CONV_3D",
        "CONV_2D_DW",
        "CONV_TRANSPOSE_2D",
        "POOL_1D",
        "POOL_2D",
        "POOL_2D_BACK",
        "UPSCALE",
        "PAD",
        "PAD_REFLECT_1D",
        "ROLL",
        "ARANGE",
        "TIMESTEP_EMBEDDING",
        "ARGSORT",
        "TOP_K",
        "LEAKY_RELU",
        "TRI",
        "FILL",
        "FLASH_ATTN_EXT",
        "FLASH_ATTN_BACK",
        "SSM_CONV",
        "SSM_SCAN",
        "WIN_PART",
        "WIN_UNPART",
        "GET_REL_POS",
        "ADD_REL_POS",
        "RWKV_WKV6",
        "GATED_LINEAR_ATTN",
        "RWKV_WKV7",
        "SOLVE_TRI",
        "GATED_DELTA_NET",
        "LIGHTNING_INDEXER",
        "DSV4_HC_COMB",
        "DSV4_HC_PRE",
        "DSV4_HC_POST",
        "UNARY",
        "MAP_CUSTOM1",
        "MAP_CUSTOM2",
        "MAP_CUSTOM3",
        "CUSTOM",
        "CROSS_ENTROPY_LOSS",
        "CROSS_ENTROPY_LOSS_BACK",
        "OPT_STEP_ADAMW",
        "OPT_STEP_SGD",
        "GLU",
    ];

    /// ggml's name of `op` ("MUL_MAT"); "?" for a value outside the enum.
    pub fn name(op: i32) -> &'static str {
        usize::try_from(op)
            .ok()
            .and_then(|i| NAMES.get(i))
            .copied()
            .unwrap_or("?")
    }

    /// Ops that only reinterpret their source's memory; nothing to compute.
    pub fn is_view(op: i32) -> bool {
        matches!(op, NONE | RESHAPE | VIEW | PERMUTE | TRANSPOSE)
    }
}

/// `enum ggml_unary_op` values.
pub mod unary {
    pub const ABS: i32 = 0;
    pub const SGN: i32 = 1;
    pub const NEG: i32 = 2;
    pub const STEP: i32 = 3;
    pub const TANH: i32 = 4;
    pub const ELU: i32 = 5;
    pub const RELU: i32 = 6;
    pub const SIGMOID: i32 = 7;
    pub const GELU: i32 = 8;
    pub const GELU_QUICK: i32 = 9;
    pub const SILU: i32 = 10;
    pub const HARDSWISH: i32 = 11;
    pub const HARDSIGMOID: i32 = 12;
    pub const EXP: i32 = 13;
    pub const GELU_ERF: i32 = 16;
}

/// `enum ggml_glu_op` values.
pub mod glu {
    pub const REGLU: i32 = 0;
    pub const GEGLU: i32 = 1;
    pub const SWIGLU: i32 = 2;
    pub const SWIGLU_OAI: i32 = 3;
    pub const GEGLU_ERF: i32 = 4;
    pub const GEGLU_QUICK: i32 = 5;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_round_trip() {
        for v in 0..64 {
            if let Some(t) = GgmlType::from_raw(v) {
                assert_eq!(t as i32, v);
                assert!(t.type_size() > 0);
            }
        }
    }

    #[test]
    fn op_names_match_the_constants() {
        assert_eq!(op::name(op::MUL_MAT), "MUL_MAT");
        assert_eq!(op::name(op::FLASH_ATTN_EXT), "FLASH_ATTN_EXT");
        assert_eq!(op::name(op::UNARY), "UNARY");
        assert_eq!(op::name(op::GLU), "GLU");
        assert_eq!(op::name(op::SET_ROWS), "SET_ROWS");
        assert_eq!(op::name(op::NONE), "NONE");
        assert_eq!(op::name(op::COUNT), "?");
        assert_eq!(op::name(-1), "?");
    }
}
