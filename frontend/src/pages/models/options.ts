// Choices offered by the registry's forms, typed by the generated enums so a value the API would refuse
// does not compile, and a choice the API adds but the forms lack fails `tsc` below.
import type { KvCacheDtype, QuantMethod } from "../../api/types";

export const QUANT_METHODS = [
  "none", "fp16", "bf16", "fp8", "int8", "awq", "gptq",
  "gguf-q2_k", "gguf-q3_k", "gguf-q4_0", "gguf-q4_1", "gguf-q4_k", "gguf-q5_0", "gguf-q5_1", "gguf-q5_k", "gguf-q6_k", "gguf-q8_0",
] as const satisfies readonly QuantMethod[];

export const KV_DTYPES = ["auto", "fp16", "bf16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp32"] as const satisfies readonly KvCacheDtype[];

// Compile-time completeness: each line is an error if the API has a value the list above lacks.
const allMethods: Record<Exclude<QuantMethod, (typeof QUANT_METHODS)[number]>, never> = {};
const allDtypes: Record<Exclude<KvCacheDtype, (typeof KV_DTYPES)[number]>, never> = {};
void allMethods;
void allDtypes;
