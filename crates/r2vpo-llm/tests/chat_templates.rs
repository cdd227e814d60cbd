//! Chat templates rendered with minijinja: SmolLM2's template from the GGUF
//! file, a Qwen3-style template with the thinking switch, the Jinja2
//! settings transformers uses, and `strip_think`.

use std::path::PathBuf;

use r2vpo_llm::chat::{strip_think, ChatMessage, ChatTemplate, RenderOptions};
use r2vpo_llm::tokenizer::Tokenizer;

fn smollm() -> Tokenizer {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.deps/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    Tokenizer::from_gguf(&p).unwrap_or_else(|e| panic!("{e} (run `make deps`)"))
}

#[test]
fn smollm2_template_renders_chatml() {
    let tok = smollm();
    let t = ChatTemplate::from_tokenizer(&tok).unwrap();
    let s = t.prompt("What is 2+2?", None).unwrap();
    assert_eq!(
        s,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
         <|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    );
    // A given system prompt replaces the default one; no generation prompt.
    let msgs = [ChatMessage::system("Be brief."), ChatMessage::user("Hi"), ChatMessage::assistant("Hello!")];
    let s = t.render(&msgs, &t.default_options(false)).unwrap();
    assert_eq!(
        s,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
    );
    // The rendered markup encodes to single special ids.
    let ids = tok.encode(&s, false).unwrap();
    assert_eq!(ids[0], 1);
    assert_eq!(ids.iter().filter(|&&i| i == 2).count(), 3);
}

/// The Qwen3 chat template's message and generation-prompt logic (tool
/// handling left out), as published with Qwen3 models.
const QWEN3: &str = r#"{%- if messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"#;

#[test]
fn qwen3_thinking_switch() {
    let t = ChatTemplate::new(QWEN3).unwrap();
    let msgs = [
        ChatMessage::system("S"),
        ChatMessage::user("Q1"),
        ChatMessage::assistant("<think>\nsome reasoning\n</think>\n\nA1"),
        ChatMessage::user("Q2"),
    ];
    let history = "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ1<|im_end|>\n\
                   <|im_start|>assistant\nA1<|im_end|>\n<|im_start|>user\nQ2<|im_end|>\n";
    let mut o = RenderOptions { add_generation_prompt: true, ..Default::default() };
    // Slow mode (the default when the variable is undefined): the model opens
    // its own <think>.
    assert_eq!(t.render(&msgs, &o).unwrap(), format!("{history}<|im_start|>assistant\n"));
    o.enable_thinking = Some(true);
    assert_eq!(t.render(&msgs, &o).unwrap(), format!("{history}<|im_start|>assistant\n"));
    // Fast mode: an empty think block is pre-filled.
    o.enable_thinking = Some(false);
    assert_eq!(t.render(&msgs, &o).unwrap(), format!("{history}<|im_start|>assistant\n<think>\n\n</think>\n\n"));
    // After the last query, the assistant's reasoning is kept.
    let msgs = [ChatMessage::user("Q"), ChatMessage::assistant("<think>r</think>A")];
    o.add_generation_prompt = false;
    assert_eq!(
        t.render(&msgs, &o).unwrap(),
        "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\nr\n</think>\n\nA<|im_end|>\n"
    );
}

#[test]
fn jinja2_whitespace_rules_and_variables() {
    // trim_blocks/lstrip_blocks: block tags on their own lines leave no
    // whitespace behind, as in transformers.
    let src = "{{ bos_token }}\n{% for m in messages %}\n  {% if m.role == 'user' %}\n[{{ m.content.strip() }}]\n  {% endif %}\n{% endfor %}\n{{ eos_token }}";
    let t = ChatTemplate::new(src).unwrap();
    let o = RenderOptions { bos_token: Some("<s>".into()), eos_token: "</s>".into(), ..Default::default() };
    let s = t.render(&[ChatMessage::user("  a "), ChatMessage::assistant("x"), ChatMessage::user("b")], &o).unwrap();
    assert_eq!(s, "<s>\n[a]\n[b]\n</s>");
}

#[test]
fn raise_exception_and_syntax_errors_are_reported() {
    let t = ChatTemplate::new(
        "{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}ok",
    )
    .unwrap();
    let e = t.render(&[ChatMessage::system("s")], &RenderOptions::default()).unwrap_err().to_string();
    assert!(e.contains("first must be user"), "{e}");
    assert_eq!(t.render(&[ChatMessage::user("u")], &RenderOptions::default()).unwrap(), "ok");
    assert!(ChatTemplate::new("{% for %}").is_err());
}

#[test]
fn strip_think_cases() {
    assert_eq!(strip_think("<think>\nlong reasoning\n</think>\n\nThe answer is 4."), "The answer is 4.");
    assert_eq!(strip_think("no thinking here"), "no thinking here");
    // Opening tag was in the prompt (R1-Distill style).
    assert_eq!(strip_think("reasoning...\n</think>\nAnswer: 7"), "Answer: 7");
    // Unclosed: reasoning cut off by the length limit, no answer.
    assert_eq!(strip_think("<think>\nstill thinking about \\boxed{3}"), "");
    assert_eq!(strip_think("pre <think>a</think>mid<think>b</think> post"), "pre mid post");
    assert_eq!(strip_think("x<think>a</think>y<think>cut"), "xy");
    assert_eq!(strip_think(""), "");
}
