// The huggingface: section as the frontend reads it (frontend/huggingface.cpp):
// every parameter mapped once with its copies' indices filled in, config
// values typed and evaluated at the loaded dims. Its mistakes are in
// tests/errors/huggingface_*.yaml; the commands that use it in
// tests/e2e/huggingface_test.cpp.
#include <doctest/doctest.h>

#include <string>

#include "frontend/huggingface_map.h"
#include "support/test_models.h"

namespace {

using napkin::frontend::HfConfigValue;

const HfConfigValue& entry(const HfConfigValue& object, const std::string& key) {
  for (size_t i = 0; i < object.keys.size(); ++i)
    if (object.keys[i] == key) return object.items[i];
  FAIL("config has no " << key);
  return object;
}

}  // namespace

TEST_CASE("huggingface section: gpt2-124m maps each of its 148 parameters once, and config follows --dims") {
  napkin::ir::Diagnostics diag;
  auto model = napkin::frontend::load_huggingface_model(napkin::testing::source_path("models/gpt2-124m.yaml"), diag,
                                                        {{{"layers", 3}, {"d", 64}, {"heads", 4}}});
  REQUIRE_MESSAGE(model, diag.render());
  const napkin::frontend::HuggingFaceMap& map = model->map;
  CHECK(map.architecture == "GPT2LMHeadModel");
  REQUIRE(map.tensors.size() == 4 + 3 * 12);
  CHECK(map.tensors.size() == model->graph.params.size());
  for (size_t i = 0; i < map.tensors.size(); ++i)  // in the model's parameter order
    CHECK(map.tensors[i].param == model->graph.value(model->graph.params[i].value).name);
  bool found = false;
  for (const auto& t : map.tensors)
    if (t.param == "h.2.fc_proj_w") {
      found = true;
      CHECK(t.hf_name == "transformer.h.2.mlp.c_proj.weight");
      CHECK_FALSE(t.transpose);
    }
  CHECK(found);
  REQUIRE(map.tied.size() == 1);
  CHECK(map.tied[0].hf_name == "lm_head.weight");
  CHECK(map.tied[0].param == "wte");
  CHECK(map.ignore.size() == 2);

  using Kind = HfConfigValue::Kind;
  CHECK(entry(map.config, "model_type").kind == Kind::String);
  CHECK(entry(map.config, "model_type").text == "gpt2");
  CHECK(entry(map.config, "n_layer").kind == Kind::Int);
  CHECK(entry(map.config, "n_layer").integer == 3);
  CHECK(entry(map.config, "n_inner").integer == 4 * 64);
  CHECK(entry(map.config, "eos_token_id").integer == 50256);
  CHECK(entry(map.config, "layer_norm_epsilon").kind == Kind::Float);
  CHECK(entry(map.config, "layer_norm_epsilon").number == 1e-5);
  CHECK(entry(map.config, "resid_pdrop").kind == Kind::Float);
}

TEST_CASE("huggingface section: transposes, nested config values, and a model without the section") {
  napkin::ir::Diagnostics diag;
  auto model = napkin::frontend::load_huggingface_model(napkin::testing::source_path("tests/models/llama-hf.yaml"), diag, {});
  REQUIRE_MESSAGE(model, diag.render());
  int transposed = 0;
  for (const auto& t : model->map.tensors) transposed += t.transpose;
  CHECK(transposed == 7);
  using Kind = HfConfigValue::Kind;
  CHECK(entry(model->map.config, "rope_scaling").kind == Kind::Null);
  CHECK(entry(model->map.config, "tie_word_embeddings").kind == Kind::Bool);
  CHECK_FALSE(entry(model->map.config, "tie_word_embeddings").flag);
  CHECK(model->map.tied.empty());

  napkin::ir::Diagnostics none;
  CHECK_FALSE(napkin::frontend::load_huggingface_model(napkin::testing::source_path("models/gpt.yaml"), none, {}));
  CHECK(none.render().find("gpt.yaml:1:1: error: the model has no huggingface: section") != std::string::npos);
}

TEST_CASE("huggingface section: a placeholder of the tensor name alone stacks the parameter's first axis, one tensor per index at the loaded dims") {
  napkin::ir::Diagnostics diag;
  auto model = napkin::frontend::load_huggingface_model(napkin::testing::source_path("tests/models/experts-hf.yaml"), diag,
                                                        {{{"experts", 4}}});
  REQUIRE_MESSAGE(model, diag.render());
  int stacked = 0;
  for (const auto& t : model->map.tensors) {
    if (t.slices.empty()) continue;
    ++stacked;
    CHECK(t.slices.size() == 4);
    if (t.param != "layers.1.w_up") continue;
    CHECK(t.hf_name == "model.layers.1.block_sparse_moe.experts.{e}.w3.weight");
    CHECK(t.transpose);
    CHECK(t.slices[0] == "model.layers.1.block_sparse_moe.experts.0.w3.weight");
    CHECK(t.slices[3] == "model.layers.1.block_sparse_moe.experts.3.w3.weight");
  }
  CHECK(stacked == 6);  // w_gate, w_up and w_down of 2 layers; the router [experts, d] is one tensor
  for (const auto& t : model->map.tensors)
    if (t.param == "layers.0.router") CHECK(t.hf_name == "model.layers.0.block_sparse_moe.gate.weight");
}

TEST_CASE("huggingface section: mixtral-8x7b maps its 323 parameters once, each expert parameter to 8 stacked tensors") {
  napkin::ir::Diagnostics diag;
  auto model = napkin::frontend::load_huggingface_model(napkin::testing::source_path("models/mixtral-8x7b.yaml"), diag, {});
  REQUIRE_MESSAGE(model, diag.render());
  const napkin::frontend::HuggingFaceMap& map = model->map;
  CHECK(map.architecture == "MixtralForCausalLM");
  REQUIRE(map.tensors.size() == 3 + 32 * 10);
  CHECK(map.tensors.size() == model->graph.params.size());
  int stacked = 0;
  for (const auto& t : map.tensors) {
    if (t.slices.empty()) continue;
    ++stacked;
    REQUIRE(t.slices.size() == 8);
    if (t.param == "layers.5.w_down") CHECK(t.slices[7] == "model.layers.5.block_sparse_moe.experts.7.w2.weight");
    if (t.param == "layers.0.w_up") CHECK(t.slices[0] == "model.layers.0.block_sparse_moe.experts.0.w3.weight");
  }
  CHECK(stacked == 3 * 32);
  CHECK(entry(map.config, "num_local_experts").integer == 8);
  CHECK(entry(map.config, "num_experts_per_tok").integer == 2);
  CHECK(entry(map.config, "intermediate_size").integer == 14336);
  CHECK(entry(map.config, "num_key_value_heads").integer == 8);
  CHECK(entry(map.config, "max_position_embeddings").integer == 32768);
  CHECK(entry(map.config, "vocab_size").integer == 32000);
}
